"""The port between the kernel-side event sources and the user-side recorder.

A source reports opens and closes of the watched device files with the process that did them. A
source that can hold an open until user space answers (fanotify permission events) asks the
registered decider whether the open may proceed; the lending rules (priority preemption) plug in
there, and until they do every open is allowed. The recorder must register before a source starts
(the patent's claim 3), and a switch turns watching on and off without stopping the source
(claim 2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

log = logging.getLogger(__name__)


class EventKind(StrEnum):
    """What happened to a watched device file."""

    OPEN = "open"
    CLOSE = "close"


class Verdict(StrEnum):
    """The answer to an open a source holds until user space decides."""

    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True)
class DeviceEvent:
    """One open or close of a watched device file by process ``pid`` at wall-clock ``time``."""

    kind: EventKind
    path: str
    pid: int
    time: float


EventSink = Callable[[DeviceEvent], None]
"""Receives every event, after the source has answered the kernel (recording never delays an open)."""

OpenDecider = Callable[[DeviceEvent], Verdict]
"""Decides whether an open may proceed; called on the source's thread while the opener waits."""


def allow_every_open(event: DeviceEvent) -> Verdict:
    """The default decider: nothing is refused until the lending rules say otherwise."""
    return Verdict.ALLOW


@dataclass(frozen=True)
class Registration:
    """What the recorder hands a source before events flow: where events go, who answers opens."""

    sink: EventSink
    decide: OpenDecider = allow_every_open


class SourceNotRegistered(RuntimeError):
    """A source was started before a recorder registered with it."""


class EventSource(Protocol):
    """A mechanism that reports opens and closes of a set of device files."""

    @property
    def name(self) -> str:
        """Short name for logs and the start-up report (``fanotify``, ``proc-scan``)."""
        ...

    @property
    def can_decide(self) -> bool:
        """Whether opens wait for the registered decider (otherwise they are only observed)."""
        ...

    @property
    def watching(self) -> bool:
        """The switch: whether events are reported now."""
        ...

    def register(self, registration: Registration) -> None:
        """Attach the recorder; must happen before :meth:`start`."""
        ...

    def start(self) -> None:
        """Begin watching; raises :class:`SourceNotRegistered` when nobody registered."""
        ...

    def set_watching(self, on: bool) -> None:
        """Turn reporting on or off; off lets every open through unobserved."""
        ...

    def stop(self) -> None:
        """Stop watching and release kernel resources; idempotent."""
        ...


class SourceBase:
    """Registration, the switch and safe delivery, shared by the concrete sources."""

    def __init__(self) -> None:
        self._registration: Registration | None = None
        self._watching = True

    @property
    def watching(self) -> bool:
        """The switch: whether events are reported now."""
        return self._watching

    def register(self, registration: Registration) -> None:
        """Attach the recorder (replaces an earlier registration)."""
        self._registration = registration

    def _require_registration(self) -> Registration:
        if self._registration is None:
            raise SourceNotRegistered(
                f"{type(self).__name__}: a recorder must register before the source starts")
        return self._registration

    def _decide(self, event: DeviceEvent) -> Verdict:
        """Ask the decider; a failing decider allows the open (a bug must not lock a GPU away)."""
        registration = self._require_registration()
        try:
            return registration.decide(event)
        except Exception:
            log.exception("open decider failed for %s by pid %d; allowing the open", event.path, event.pid)
            return Verdict.ALLOW

    def _deliver(self, event: DeviceEvent) -> None:
        """Hand an event to the sink; a failing sink is logged, the source keeps running."""
        registration = self._require_registration()
        try:
            registration.sink(event)
        except Exception:
            log.exception("usage recorder failed on %s of %s by pid %d", event.kind, event.path, event.pid)
