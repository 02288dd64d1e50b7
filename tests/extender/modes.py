"""The extender's filter modes as the tests build them.

``ExtenderSettings()`` is the extender users run (its defaults are the CLI's): the filter passes one
of the policy's best nodes and books the pod's cards there until its bind. A test that needs another
mode names it with one of these, so that a reader sees it is not the shipped one.
"""

from __future__ import annotations

from gpupool.extender.service import ExtenderSettings

SHIPPED = ExtenderSettings()
"""``gpupool extender`` without flags: ``--filter-best-only --filter-one-best``."""

EVERY_FIT = ExtenderSettings(filter_best_only=False)
"""Not the default: ``--no-filter-best-only``, for the ``-prioritize.yaml`` scheduler configurations.
The filter passes every node that fits and gives every other node its reason: the mode for tests
about which nodes fit and why the others do not."""

ALL_BEST = ExtenderSettings(filter_best_only=True, filter_one_best=False)
"""Not the default: ``--filter-all-best``: every one of the policy's best nodes, ties included."""
