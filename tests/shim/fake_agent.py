"""A node agent's registration socket for the library's tests: one JSON request line per
connection, recorded, and the reply line ``answer(request)`` gives."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

Answer = Callable[[dict[str, Any]], bytes]
"""The reply line for a request."""


class FakeAgent:
    """A unix-socket server that records each request and answers it with ``answer(request)``."""

    def __init__(self, path: Path, answer: Answer) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answer = answer
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with connection:
                request = json.loads(connection.makefile("rb").readline())
                self.requests.append(request)
                try:
                    connection.sendall(self.answer(request))
                except OSError:  # the client gave up waiting (a slow answer): serve the next one
                    continue

    def close(self) -> None:
        self.server.close()


def replying(line: bytes) -> Answer:
    """An answer that is ``line`` whatever was asked."""
    return lambda _request: line
