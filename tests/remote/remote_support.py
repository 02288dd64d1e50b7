"""Helpers of the remote GPU tests: the programs built once, a GPU server started on demand."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.api.remote_gpu import RemoteClient, encode_clients
from gpupool.shim.build import build_standin, find_compiler
from gpupool.shim.remote_build import build_client

REPO = Path(__file__).resolve().parents[2]
PROBE_SOURCE = REPO / "bench" / "remote_probe.c"
SERVE = [sys.executable, "-c", "from gpupool.cli.main import main; main()", "remote-gpu", "serve"]
CARD = "GPU-standin-0"


def token(letter: str) -> str:
    """A well-formed token (43 URL-safe characters, as the node agent makes them)."""
    return letter * 43


def client(letter: str, memory_mib: int = 256, pod: str | None = None) -> RemoteClient:
    return RemoteClient(token(letter), pod or f"ns/pod-{letter}", CARD, memory_mib, 0)


def write_clients(path: Path, clients: Sequence[RemoteClient]) -> None:
    """Replace the clients file atomically, as the node agent does."""
    staged = path.with_suffix(".new")
    staged.write_text(encode_clients(clients))
    os.replace(staged, path)


@dataclass(frozen=True)
class Programs:
    standin: Path
    """Directory of the stand-in driver (the server's libcuda.so.1)."""
    client: Path
    """Directory of the GPU client built as libcuda.so.1."""
    probe: Path
    """bench/remote_probe.c linked against libcuda.so (run it with either directory first)."""


def build_programs(out: Path) -> Programs:
    standin = build_standin(werror=True)
    client_dir = build_client(werror=True, grant_path=str(out / "grant"))
    probe = out / "remote_probe"
    subprocess.run([*find_compiler(), "-O1", "-o", str(probe), str(PROBE_SOURCE), f"-L{client_dir}", "-lcuda"],
                   check=True, timeout=120)
    return Programs(standin, client_dir, probe)


def build_client_program(source: Path, out: Path, programs: Programs, link: Sequence[str] = ("-lcuda",)) -> Path:
    """A probe program ``source`` compiled strictly into ``out`` and linked with ``link`` against the
    GPU client's directory (by default its ``libcuda.so``: run it with the client's or the stand-in
    driver's directory first; the probes of gpupool's runtime and cuBLAS link those instead)."""
    subprocess.run([*find_compiler(), "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-o", str(out),
                    str(source), f"-L{programs.client}", *link], check=True, timeout=120)
    return out


@dataclass
class Server:
    process: subprocess.Popen[str]
    port: int
    clients_file: Path
    log: list[str] = field(default_factory=list)

    def children(self) -> list[int]:
        """The pids of every process of the server (supervisor, C server, per-client processes)."""
        found: list[int] = []
        todo = [self.process.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*"):
                with contextlib.suppress(OSError):
                    todo += [int(p) for p in (task / "children").read_text().split()]
        return found

    def client_processes(self) -> list[int]:
        """The per-client processes (children of the C server)."""
        return self.children()[2:]

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


def start_serve(command: Sequence[str], env: dict[str, str],
                timeout: float) -> tuple[subprocess.Popen[str], int, list[str]]:
    """A started ``gpupool remote-gpu serve`` (in a session of its own), the port it reported and its
    output so far; AssertionError with that output when it reports none within ``timeout``."""
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True, cwd=REPO)
    assert process.stdout is not None
    port = 0
    log: list[str] = []
    deadline = time.monotonic() + timeout
    while port == 0 and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        log.append(line)
        if line.startswith("listening on port "):
            port = int(line.split()[-1])
    if port == 0:
        process.kill()
        raise AssertionError(f"the server did not start: {''.join(log)}")
    return process, port, log


@contextmanager
def running_server(programs: Programs, workdir: Path, clients: Sequence[RemoteClient], *,
                   listen: str = "127.0.0.1:0", prefix: Sequence[str] = (), extra: Sequence[str] = (),
                   card_mib: int = 16384, card: dict[str, str] | None = None) -> Iterator[Server]:
    """``gpupool remote-gpu serve`` on the stand-in driver (its cards shared by the server's client
    processes, as a real card is), stopped at the end."""
    clients_file = workdir / "clients.json"
    write_clients(clients_file, clients)
    env = {**os.environ, "GPUPOOL_STANDIN_STATE": str(workdir / "standin.state"), "GPUPOOL_STANDIN_SHARED_MEMORY": "1",
           "GPUPOOL_STANDIN_MEMORY_MIB": str(card_mib), "GPUPOOL_STANDIN_KERNEL_US": "1", "PYTHONPATH": str(REPO),
           "LD_LIBRARY_PATH": str(programs.standin), **(card or {})}
    command = [*prefix, *SERVE, "--listen", listen, "--clients", str(clients_file),
               "--driver", str(programs.standin / "libcuda.so.1"), *extra]
    process, port, log = start_serve(command, env, timeout=120)  # the first run compiles the server
    server = Server(process, port, clients_file, log)
    try:
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def probe_env(programs: Programs, endpoint: str, secret: str, deadline_ms: int = 10000) -> dict[str, str]:
    return {**os.environ, "LD_LIBRARY_PATH": str(programs.client), "GPUPOOL_REMOTE_ENDPOINT": endpoint,
            "GPUPOOL_REMOTE_TOKEN": secret, "GPUPOOL_REMOTE_DEADLINE_MS": str(deadline_ms)}


def run_probe(programs: Programs, env: dict[str, str], *args: str, timeout: float = 60,
              prefix: Sequence[str] = ()) -> str:
    done = subprocess.run([*prefix, str(programs.probe), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return done.stdout.strip()


def wait_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The next line the process prints, within ``timeout`` seconds ("" when none came)."""
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    if not selector.select(timeout):
        return ""
    return process.stdout.readline().strip()


def clients_json(clients: Sequence[RemoteClient]) -> dict[str, object]:
    loaded: dict[str, object] = json.loads(encode_clients(clients))
    return loaded


@dataclass(frozen=True)
class Certificates:
    ca: Path
    certificate: Path
    key: Path


def make_certificates(out: Path, addresses: Sequence[str] = ("127.0.0.1",), name: str = "ca") -> Certificates:
    """A CA and a server certificate for ``addresses`` (IP subject alternative names), by openssl."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60, cwd=out)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *curve, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "1",
            "-subj", f"/CN=gpupool test {name}")
    openssl("req", *curve, "-keyout", f"{name}-server.key", "-out", f"{name}-server.csr", "-subj", "/CN=gpu-server")
    (out / f"{name}.ext").write_text("subjectAltName=" + ",".join(f"IP:{a}" for a in addresses) + "\n")
    openssl("x509", "-req", "-in", f"{name}-server.csr", "-CA", f"{name}.pem", "-CAkey", f"{name}.key",
            "-CAcreateserial", "-out", f"{name}-server.pem", "-days", "1", "-extfile", f"{name}.ext")
    return Certificates(out / f"{name}.pem", out / f"{name}-server.pem", out / f"{name}-server.key")


def busy_percent(programs: Programs, state: Path, start_ns: int, end_ns: int) -> float:
    """How busy the stand-in's card 0 was in [start, end) (CLOCK_MONOTONIC), per cent, as NVML
    would report it: read from the stand-in's shared timeline."""
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); f = lib.gpupoolStandinBusyNs; "
            "f.restype = ctypes.c_uint64; f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]; "
            "print(f(0, 0, int(sys.argv[2]), int(sys.argv[3])))")
    done = subprocess.run([sys.executable, "-c", code, str(programs.standin / "libcuda.so.1"), str(start_ns),
                           str(end_ns)], env={**os.environ, "GPUPOOL_STANDIN_STATE": str(state)},
                          capture_output=True, text=True, check=True, timeout=60)
    return 100.0 * int(done.stdout) / (end_ns - start_ns)
