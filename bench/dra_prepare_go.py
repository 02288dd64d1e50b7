"""The Go client of bench/dra_prepare.py (``bench/dra_prepare_client/main.go``), built once and cached.

kubelet is a Go program: its gRPC client costs the node little CPU next to a Python ``grpc.aio``
client, which on a small machine competes with the plugin for the same cores. The bench therefore
drives the plugin from a Go client by default. It is built as the test environment builds its Go
programs (:mod:`gpupool.testenv.gobuild`: the machine's Go, pinned modules from the module proxy,
the binary cached under the test environment's cache and rebuilt only when its source or pins
change), so a warm machine runs it at once; the first run compiles it (about a minute).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpupool.testenv.errors import TestenvError
from gpupool.testenv.gobuild import GoBuild, GoProgram, build, ensure_built, toolchain_problem, wrapper_go_mod
from gpupool.testenv.steps import exclusive_lock

#: The client's source, next to this file.
SOURCE = Path(__file__).resolve().parent / "dra_prepare_client" / "main.go"
COMMAND = "gpupool-dra-prepare-client"
#: kubelet's DRA API (the generated Go of the service the plugin serves) and the gRPC release that
#: module requires; the modules they need are chosen by Go from these two pins.
REQUIRES = (("k8s.io/kubelet", "v0.37.2"), ("google.golang.org/grpc", "v1.82.1"))
BUILD_LOCK = ".build-dra-prepare-client.lock"


def _spec() -> GoBuild:
    source = SOURCE.read_bytes()
    return GoBuild(key=f"dra-prepare-client-{hashlib.sha256(source).hexdigest()[:16]}",
                   go_mod=wrapper_go_mod(REQUIRES),
                   programs=(GoProgram(COMMAND, f"gpupool.local/testenv/cmd/{COMMAND}"),),
                   sources={f"cmd/{COMMAND}/main.go": source})


def client_binary() -> Path:
    """The built client, compiled first if the cache lacks it. Raises
    :class:`~gpupool.testenv.errors.TestenvError` saying why it cannot be built (no Go, no module
    proxy, a failed compile: the message names the log)."""
    spec = _spec()

    def find() -> Path | None:
        return spec.paths()[COMMAND] if spec.is_built() else None

    def make(logs: Path) -> None:
        build(spec, logs=logs)

    return ensure_built(find, make, what="the DRA bench's Go client", lock_name=BUILD_LOCK,
                        problem=toolchain_problem, lock=exclusive_lock)


def unavailable() -> str | None:
    """Why the Go client cannot be used here, or ``None`` (building it if needed)."""
    try:
        client_binary()
    except TestenvError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class GoRounds:
    """The measured rounds, as the client timed them."""

    prepare_ms: list[float]
    unprepare_ms: list[float]
    prepare_wall_s: float
    unprepare_wall_s: float


def run_client(socket: str, claims: int, warmup: int, timeout_s: float = 120.0) -> GoRounds:
    """Run the client against the plugin on ``socket`` (warm-up, then the measured rounds)."""
    done = subprocess.run([str(client_binary()), f"--socket={socket}", f"--claims={claims}", f"--warmup={warmup}"],
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the Go client failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    out = json.loads(done.stdout)
    return GoRounds([float(x) for x in out["prepare_ms"]], [float(x) for x in out["unprepare_ms"]],
                    float(out["prepare_wall_s"]), float(out["unprepare_wall_s"]))
