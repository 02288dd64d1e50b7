"""An event source driven by the test: it records the order of calls and delivers what it is told."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.nodeagent.monitor.events import DeviceEvent, Registration, SourceBase


@dataclass
class ScriptedSource(SourceBase):
    """:class:`EventSource` whose events come from :meth:`emit`; ``fail_start`` makes start raise."""

    fail_start: bool = False
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    @property
    def name(self) -> str:
        return "scripted"

    @property
    def can_decide(self) -> bool:
        return False

    def register(self, registration: Registration) -> None:
        self.calls.append("register")
        super().register(registration)

    def start(self) -> None:
        self._require_registration()
        self.calls.append("start")
        if self.fail_start:
            raise OSError("no such mechanism")

    def set_watching(self, on: bool) -> None:
        self._watching = on

    def stop(self) -> None:
        self.calls.append("stop")

    def emit(self, event: DeviceEvent) -> None:
        self._deliver(event)
