"""The objects of a rendered manifest (``helm template``, ``kubectl kustomize``), parsed once per text.

The chart's tests render a few dozen value sets and read each rendering many times; PyYAML's pure-
Python parser took ~60 ms per rendering of the chart (37 kB) and was most of those tests' CPU. The
text is parsed once with libyaml's loader (PyYAML's own where libyaml is missing: the same objects)
and each caller gets a deep copy, which it may change.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import yaml

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> tuple[dict[str, Any], ...]:
    return tuple(doc for doc in yaml.load_all(text, Loader=_LOADER) if doc is not None)


def documents(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``text``, a fresh copy each call."""
    return copy.deepcopy(list(_parsed(text)))
