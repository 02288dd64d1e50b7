"""The library's side of registration, for tests: real sockets, and real child processes.

The child processes matter: the server identifies its peer by ``SO_PEERCRED``, so a registration
from the test process itself would not show that the pid recorded is the registering process's.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator

from gpupool.api.shim_contract import RegisterReply, RegisterRequest, decode_reply, encode_request

# Connects, sends argv[2], prints the reply line, then stays alive until its stdin closes.
_CHILD = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode())
print(s.makefile("rb").readline().decode().strip(), flush=True)
sys.stdin.read()
"""

# Connects, hands the connected socket to the parent over fd argv[2] (SCM_RIGHTS), and exits at once.
_HAND_OVER = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
parent = socket.socket(fileno=int(sys.argv[2]))
socket.send_fds(parent, [b"x"], [s.fileno()])
"""


def exchange(path: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` from this process, return the reply line (b"" when closed without one)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(data)
        return sock.makefile("rb").readline()


@contextlib.contextmanager
def registered_child(path: str, request: RegisterRequest) -> Iterator[tuple[subprocess.Popen[str], RegisterReply]]:
    """A child process that registered with ``request``; it lives until the block ends."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, path, encode_request(request).decode()],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        yield child, decode_reply(line.encode())
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()


def connection_of_dead_process(path: str) -> tuple[socket.socket, int]:
    """A socket connected to ``path`` by a child process that has exited (and been reaped) since."""
    mine, theirs = socket.socketpair(socket.AF_UNIX)
    with mine, theirs:
        child = subprocess.Popen([sys.executable, "-c", _HAND_OVER, path, str(theirs.fileno())],
                                 pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        _msg, fds, _flags, _addr = socket.recv_fds(mine, 1, 1)
        child.wait(10)
    return socket.socket(fileno=fds[0]), child.pid
