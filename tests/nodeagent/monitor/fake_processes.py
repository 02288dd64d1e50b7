"""A scripted process table for the recorder's rules."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FakeProcesses:
    """Processes by pid with their start time and the watched paths they hold."""

    start: dict[int, int] = field(default_factory=dict)
    held: dict[int, set[str]] = field(default_factory=dict)

    def spawn(self, pid: int, *paths: str, start: int = 1000) -> None:
        """A process ``pid`` started at ``start`` holding ``paths``."""
        self.start[pid] = start
        self.held[pid] = set(paths)

    def close(self, pid: int, path: str) -> None:
        """``pid`` closes ``path``."""
        self.held[pid].discard(path)

    def exit(self, pid: int) -> None:
        """``pid`` is gone."""
        self.start.pop(pid, None)
        self.held.pop(pid, None)

    def start_time(self, pid: int) -> int | None:
        return self.start.get(pid)

    def holds(self, pid: int, path: str) -> bool:
        return path in self.held.get(pid, set())

    def holders(self) -> dict[str, set[int]]:
        found: dict[str, set[int]] = {}
        for pid, paths in self.held.items():
            for path in paths:
                found.setdefault(path, set()).add(pid)
        return found
