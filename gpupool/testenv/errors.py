"""Exception types of the test environment, precise enough to act on."""

from __future__ import annotations


class TestenvError(Exception):
    """Base class of every error raised by :mod:`gpupool.testenv`."""

    __test__ = False  # not a pytest test class despite the name


class BuildImpossibleError(TestenvError):
    """This machine cannot build the binaries at all (not root, no apt, no route to Debian).

    Test fixtures turn this one into ``pytest.skip``; every other error is a real failure.
    """


class BuildFailedError(TestenvError):
    """A build step ran and failed; the message names the step and the log to read."""


class StartupError(TestenvError):
    """A component did not become ready in time or exited early; the message names its log."""
