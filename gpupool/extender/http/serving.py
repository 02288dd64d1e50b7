"""Running the extender's HTTP servers: the verbs' port (plain, or TLS with client certificates) and,
beside a TLS port, a plain-HTTP health port.

Why a second port rather than health paths open on the TLS port without a client certificate: with
``CERT_REQUIRED`` the handshake refuses every client without a certificate from the client CA, so no
request for a verb from an unauthenticated client is ever parsed; kubelet's probes and Prometheus
present no certificate, so they get their own port that serves nothing else (kube-scheduler's
own layout: a secure port for the API, health on a separate one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field

from aiohttp import web

from gpupool.extender.http.tls import ReloadingTls
from gpupool.netguard.limits import ServerLimits
from gpupool.netguard.site import BoundedSite, bounded_runner

log = logging.getLogger(__name__)

#: The health port a TLS extender opens when ``--health-port`` is not given.
DEFAULT_HEALTH_PORT = 8889
PLAIN_HTTP_WARNING = ("serving the extender's verbs over plain HTTP without client authentication: anyone who "
                      "reaches this port can bind pods; give --tls-cert-file, --tls-private-key-file and "
                      "--client-ca-file (docs/security.md)")
NO_CLIENT_CA_WARNING = ("serving TLS without --client-ca-file: clients are not authenticated, anyone who reaches "
                        "this port can bind pods (docs/security.md)")


@dataclass(frozen=True)
class Listeners:
    """Where to listen: the verbs' port, its TLS (None: plain HTTP) and the health port (None: none)."""

    host: str
    port: int
    tls: ReloadingTls | None = None
    health_port: int | None = None
    admission_port: int | None = None
    """The admission webhook's TLS port (None: none); it serves ``admission_tls``, the same
    certificate as the verbs without a client CA (the apiserver presents none)."""
    admission_tls: ReloadingTls | None = None
    limits: ServerLimits = field(default_factory=ServerLimits)
    """Connection cap and timeouts of each port (docs/security.md, "Bounded servers")."""


def warn_if_open(listeners: Listeners) -> None:
    """Log what a plain or anonymous server exposes (started anyway: that is how it ran before)."""
    if listeners.tls is None:
        log.warning(PLAIN_HTTP_WARNING)
    elif not listeners.tls.files.client_ca_file:
        log.warning(NO_CLIENT_CA_WARNING)


async def serve(app: web.Application, probes: web.Application | None, listeners: Listeners,
                stop: asyncio.Event, admission: web.Application | None = None) -> None:
    """Serve until ``stop`` is set; certificate files are polled meanwhile (see :mod:`.tls`).
    ``admission``: the webhook's application, on ``listeners.admission_port``."""
    runners: list[web.AppRunner] = []
    reloading: list[asyncio.Task[None]] = []
    limits = listeners.limits

    async def site(application: web.Application, port: int, tls: ReloadingTls | None, name: str) -> None:
        runner = bounded_runner(application, limits, access_log=None, handle_signals=False)
        runners.append(runner)
        await runner.setup()
        await BoundedSite(runner, listeners.host, port, limits, tls.context if tls else None, name).start()

    try:
        await site(app, listeners.port, listeners.tls, "the verbs' port")
        if probes is not None and listeners.health_port is not None:
            await site(probes, listeners.health_port, None, "the health port")
        if admission is not None and listeners.admission_port is not None and listeners.admission_tls is not None:
            await site(admission, listeners.admission_port, listeners.admission_tls, "the admission port")
            reloading.append(asyncio.create_task(listeners.admission_tls.watch(), name="gpupool-admission-tls-reload"))
        if listeners.tls is not None:
            reloading.append(asyncio.create_task(listeners.tls.watch(), name="gpupool-tls-reload"))
        await stop.wait()
    finally:
        for task in reloading:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runner in reversed(runners):
            await runner.cleanup()


def run_until_signalled(app: web.Application, probes: web.Application | None, listeners: Listeners,
                        admission: web.Application | None = None) -> None:
    """Serve until SIGINT or SIGTERM (what ``web.run_app`` did, for two sites)."""
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(app, probes, listeners, stop, admission)

    asyncio.run(main())
