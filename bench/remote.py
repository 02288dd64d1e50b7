"""Remote GPU data plane on loopback: what a CUDA program pays for its GPU being across the network.

    python3 bench/remote.py --json [--calls 20000] [--mib 64] [--launches 20000] [--gemms 20000] [--tls]
                               [--enforce-compute]

A CUDA driver API program (bench/remote_probe.c) is linked against the GPU client and talks to
``gpupool remote-gpu serve`` on 127.0.0.1 running the stand-in driver (kernels of 1 us), then the
same program runs on the stand-in directly (``local``) for reference. ``--tls``: the server speaks
TLS with a certificate made for the run (the openssl command) and the client checks it;
``--enforce-compute``: the client's calls run in an executor under the interception library (no
compute limit set, so what is measured is the relay's cost):

- ``rtt_p50_us`` / ``rtt_p99_us``: one synchronous call (cuDriverGetVersion, answered by the
  server) over ``--calls``;
- ``h2d_gbit_s`` / ``d2h_gbit_s``: 5 copies of ``--mib`` MiB to the device (then one
  synchronisation) and back, in Gb/s;
- ``launches_per_s``: ``--launches`` kernel launches then one synchronisation (launches are sent
  in batches without a reply each);
- ``blas``: ``sgemm_per_s``, ``--gemms`` SGEMMs of 16 x 16 through gpupool's cuBLAS
  (bench/remote_blas_probe.c, on gpupool's runtime) then one synchronisation, the server running
  the stand-in cuBLAS (gpupool/shim/src/standin/cublas.c) with GPUPOOL_STANDIN_CUBLAS_NO_MATH=1
  (its GEMM checks its arguments and returns: what is measured is the relay, not the stand-in
  driver's memory lookups, which cost ~120 us a GEMM), and ``sgemm_per_s_answered`` the same
  with ``GPUPOOL_REMOTE_BLAS_SYNC=1`` (each call answered); ``{"skipped": why}`` when the stand-in
  cuBLAS or the program cannot be built.

Targets (issue 25): rtt p50 <= 60 us, copies >= 10 Gb/s for 64 MiB. Figures depend on the
machine's load: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupool.api.remote_gpu import RemoteClient, encode_clients
from gpupool.shim.build import STANDIN_DIR, build_standin, find_compiler
from gpupool.shim.remote_build import BLAS_SONAME, build_client

PROBE = Path(__file__).resolve().parent / "remote_probe.c"
BLAS_PROBE = Path(__file__).resolve().parent / "remote_blas_probe.c"
BLAS_SIZE = 16
TOKEN = "b" * 43


def _probe(env: dict[str, str], probe: Path, args: list[str]) -> dict[str, float]:
    done = subprocess.run([str(probe), "bench", *args], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    try:
        figures: dict[str, float] = json.loads(line)
    except ValueError:
        raise SystemExit(f"the probe failed: {line}") from None
    return figures


def _build_blas(work: Path, standin: Path, client: Path) -> tuple[Path, Path] | str:
    """The stand-in cuBLAS (as the tests build it) and the SGEMM program, or why they cannot be built."""
    library, program = work / BLAS_SONAME, work / "remote_blas_probe"
    try:
        subprocess.run([*find_compiler(), "-std=gnu11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
                        f"-Wl,-soname,{BLAS_SONAME}", "-o", str(library), str(STANDIN_DIR / "cublas.c"),
                        f"-L{standin}", "-lcuda"], check=True, capture_output=True, timeout=300)
        subprocess.run([*find_compiler(), "-O2", "-o", str(program), str(BLAS_PROBE), f"-L{client}", "-lcublas",
                        "-lcudart", f"-Wl,-rpath,{client}"], check=True, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as error:
        return f"cannot build the stand-in cuBLAS or {BLAS_PROBE.name}: {error}"
    return library, program


def _blas(env: dict[str, str], program: Path, gemms: int) -> dict[str, float] | str:
    """SGEMMs per second sent without a reply, and answered (GPUPOOL_REMOTE_BLAS_SYNC=1)."""
    figures: dict[str, float] = {}
    for key, extra in (("sgemm_per_s", {}), ("sgemm_per_s_answered", {"GPUPOOL_REMOTE_BLAS_SYNC": "1"})):
        done = subprocess.run([str(program), str(gemms), str(BLAS_SIZE)], env={**env, **extra}, capture_output=True,
                              text=True, timeout=600, check=False)
        line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()
        try:
            figures[key] = float(json.loads(line)["sgemm_per_s"])
        except (ValueError, KeyError, TypeError):
            return f"the cuBLAS program failed: {line}"
    return figures


def _certificates(work: Path) -> tuple[list[str], dict[str, str]]:
    """A CA and a certificate for 127.0.0.1: the server's arguments and the client's environment."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=work)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=bench ca")
    openssl("req", *curve, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=bench")
    (work / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            "server.pem", "-days", "1", "-extfile", "ext")
    return (["--tls-cert", str(work / "server.pem"), "--tls-key", str(work / "server.key")],
            {"GPUPOOL_REMOTE_TLS_CA": str(work / "ca.pem")})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--launches", type=int, default=20000)
    parser.add_argument("--gemms", type=int, default=20000, help="SGEMMs of 16 x 16 for the cuBLAS figure")
    parser.add_argument("--tls", action="store_true", help="TLS between client and server")
    parser.add_argument("--enforce-compute", action="store_true", help="serve through the executor")
    options = parser.parse_args()
    standin, client = build_standin(), build_client()
    with tempfile.TemporaryDirectory(prefix="gpupool-remote-bench-") as work:
        probe = Path(work) / "remote_probe"
        subprocess.run([*find_compiler(), "-O2", "-o", str(probe), str(PROBE), f"-L{client}", "-lcuda"], check=True)
        built = _build_blas(Path(work), standin, client)
        clients = Path(work) / "clients.json"
        clients.write_text(encode_clients([RemoteClient(TOKEN, "bench/probe", "GPU-standin-0", 4 * options.mib, 0)]))
        standin_env = {**os.environ, "LD_LIBRARY_PATH": str(standin),
                       "GPUPOOL_STANDIN_STATE": str(Path(work) / "standin.state"),
                       "GPUPOOL_STANDIN_KERNEL_US": "1", "GPUPOOL_STANDIN_QUEUE_US": "1000000"}
        if not isinstance(built, str):
            standin_env["GPUPOOL_REMOTE_CUBLAS"] = str(built[0])
            standin_env["GPUPOOL_STANDIN_CUBLAS_NO_MATH"] = "1"  # the relay, not the stand-in's memory lookups
        tls_args, client_env = (_certificates(Path(work)) if options.tls else ([], {}))
        server = subprocess.Popen(
            [sys.executable, "-c", "from gpupool.cli.main import main; main()", "remote-gpu", "serve", "--listen",
             "127.0.0.1:0", "--clients", str(clients), "--driver", str(standin / "libcuda.so.1"), *tls_args,
             *(["--enforce-compute"] if options.enforce_compute else [])],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=standin_env, start_new_session=True)
        try:
            assert server.stdout is not None
            port = 0
            for line in server.stdout:
                if line.startswith("listening on port "):
                    port = int(line.split()[-1])
                    break
            if port == 0:
                raise SystemExit("the GPU server did not start")
            args = [str(options.calls), str(options.mib), str(options.launches)]
            remote_env = {**os.environ, **client_env, "LD_LIBRARY_PATH": str(client), "GPUPOOL_REMOTE_TOKEN": TOKEN,
                          "GPUPOOL_REMOTE_ENDPOINT": f"127.0.0.1:{port}"}
            remote = _probe(remote_env, probe, args)
            blas = built if isinstance(built, str) else _blas(remote_env, built[1], options.gemms)
            local = _probe({**standin_env, "LD_LIBRARY_PATH": str(standin)}, probe, args)
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    result = {"remote": remote, "local": local, "blas": {"skipped": blas} if isinstance(blas, str) else blas,
              "tls": options.tls, "enforce_compute": options.enforce_compute,
              "calls": options.calls, "copy_mib": options.mib,
              "launches": options.launches, "gemms": options.gemms, "cpus": os.cpu_count(),
              "load1": round(os.getloadavg()[0], 2)}
    if options.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
