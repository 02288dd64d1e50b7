"""Running the GPU server on a GPU node and handing each remote client its token.

:class:`ServerProcess` keeps ``gpupool remote-gpu serve --listen HOST:PORT --clients FILE`` (the
data plane's server) running: started once, started again a little after it exits, terminated when
the agent stops, and told to load its TLS files again after a renewal (:meth:`ServerProcess.reload`).
:class:`TokenSecrets` writes the Secret of every pod newly served
(:func:`gpupool.nodeagent.remote_server.token_secret`) and again when its token changed; a write
that fails is tried again at the next :meth:`TokenSecrets.publish` (each change of the clients,
and every ``retry_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpupool.nodeagent.remote_server import RemoteClients, token_secret

log = logging.getLogger(__name__)

RESTART_S = 2.0
"""Pause before a server that exited is started again (a crash loop costs one start per pause)."""
STOP_GRACE_S = 5.0
"""How long a terminated server gets to close its clients before it is killed."""


def server_command(listen: str, clients: Path, program: Sequence[str] = ("gpupool",), *,
                   tls: tuple[Path, Path] | None = None, enforce_compute: bool = False,
                   allow_plain: bool = False, cublas: str | None = None) -> list[str]:
    """The data plane's server command line for ``listen`` (``HOST:PORT``) and the clients file;
    ``tls`` is the certificate chain and key it speaks TLS with, ``enforce_compute`` holds each
    client to its compute share, ``allow_plain`` lets it serve plain TCP off loopback, ``cublas``
    names NVIDIA's ``libcublas.so.12`` (None: the server looks for one itself)."""
    argv = [*program, "remote-gpu", "serve", "--listen", listen, "--clients", str(clients)]
    if tls is not None:
        argv += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    if enforce_compute:
        argv.append("--enforce-compute")
    if allow_plain:
        argv.append("--allow-plain")
    if cublas is not None:
        argv += ["--cublas", cublas]
    return argv


class ServerProcess:
    """Keeps one server process running until :meth:`run` is cancelled."""

    def __init__(self, argv: Sequence[str], *, restart_s: float = RESTART_S) -> None:
        self.argv = list(argv)
        self.restart_s = restart_s
        self.starts = 0
        self.process: asyncio.subprocess.Process | None = None

    async def run(self) -> None:
        try:
            while True:
                self.process = await asyncio.create_subprocess_exec(*self.argv)
                self.starts += 1
                code = await self.process.wait()
                log.warning("remote GPU server exited with %s; starting it again in %g s", code, self.restart_s)
                await asyncio.sleep(self.restart_s)
        finally:
            await self._stop()

    def reload(self) -> bool:
        """Tell the running server to load its certificate and key again (SIGHUP): new connections get
        the renewed certificate, open ones keep their TLS sessions and their calls go on. False when
        no server runs (the next one starts with the files as they are)."""
        process = self.process
        if process is None or process.returncode is not None:
            return False
        try:
            process.send_signal(signal.SIGHUP)
        except ProcessLookupError:
            return False
        return True

    async def _stop(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


class TokenSecrets:
    """Writes each served pod's Secret (endpoint and token) once per token."""

    def __init__(self, clients: RemoteClients, write: Callable[[dict[str, Any]], None], endpoint: str,
                 client_ca: str | None = None) -> None:
        self.clients = clients
        self.write = write
        self.endpoint = endpoint
        self.client_ca = client_ca
        """The PEM clients check the server's certificate against, handed in each Secret (TLS only)."""
        self._written: dict[str, str] = {}
        """Token per pod uid whose Secret is written."""

    def publish(self) -> int:
        """Write the Secrets still missing; returns how many failed (tried again next time)."""
        failed = 0
        shares, issued = self.clients.snapshot()
        served = {share.pod_uid: share for share in shares}
        self._written = {uid: token for uid, token in self._written.items() if uid in served}
        for uid, share in served.items():
            token = issued[uid]
            if self._written.get(uid) == token:
                continue
            try:
                self.write(token_secret(share, token, self.endpoint, self.client_ca))
            except Exception as exc:  # an API error must not stop the agent; retried next time
                failed += 1
                log.warning("remote GPU: cannot write the token Secret of pod %s: %s", share.pod, exc)
            else:
                self._written[uid] = token
        return failed
