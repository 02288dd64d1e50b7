"""``gpupool node-agent --remote-gpu-server HOST:PORT``: a GPU node serving remote shares.

Wires :mod:`gpupool.nodeagent.remote_server` and :mod:`gpupool.nodeagent.remote_serving` to the
API: a list+watch of every pod (remote clients are bound to other nodes, so the agent's watch of its
own node's pods does not see them; only pods carrying a ``remote-share-v1`` are kept), the clients
file rewritten on each change, the server process, and the token Secrets written from the agent's
loop (at each change and every ``PUBLISH_EVERY_S``, which retries failed writes).

The agent then needs, beyond its usual permissions: ``list``/``watch`` of pods in every namespace
(without its field selector) and ``create``/``patch`` of Secrets (docs/remote-gpu.md lists the
RBAC and the admission policy that confines it to ``*-gpupool-remote`` Secrets).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.api.names import ResourceNames
from gpupool.kube.listwatch import ListWatch
from gpupool.nodeagent.remote_certificate import (
    CERT_FILE,
    KEY_FILE,
    CertificateDenied,
    CertificateRefused,
    ServerCertificate,
)
from gpupool.nodeagent.remote_server import RemoteClients
from gpupool.nodeagent.remote_serving import ServerProcess, TokenSecrets, server_command

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 10.0
"""Seconds between passes that write the Secrets still missing (failed writes are retried)."""
CLIENTS_FILE = "remote-gpu-clients.json"
"""The clients file's name in the agent's state directory."""
CERTIFICATE_RETRY_S = 30.0
"""Seconds between asks for the node's certificate while the signer does not answer (or the API
fails), and before the first ask after a denial."""
CERTIFICATE_RETRY_MAX_S = 300.0
"""The longest pause between asks while the signer keeps denying."""


def retry_after(denials: int, retry_s: float = CERTIFICATE_RETRY_S, most_s: float = CERTIFICATE_RETRY_MAX_S) -> float:
    """The pause before asking again after ``denials`` denials in a row: ``retry_s``, doubled after
    each further denial up to ``most_s``. Each ask after a denial makes a new request object
    (:mod:`gpupool.nodeagent.remote_certificate`), which kube-controller-manager removes an hour
    later; with the defaults a node denied for an hour leaves about 15 of them, where a steady
    30 s pause would leave over 100."""
    if denials <= 1:
        return retry_s
    return min(most_s, retry_s * 2.0 ** min(denials - 1, 32))


def host_port(value: str, what: str) -> str:
    """``value`` when it is ``HOST:PORT`` with a port 1..65535; ``ValueError`` naming ``what``."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what}: expected HOST:PORT with a port 1..65535, got {value!r}")
    return value


@dataclass(frozen=True)
class RemoteGpuOptions:
    """Where the server listens, what clients dial, where its clients file lives, how it is started."""

    listen: str
    endpoint: str
    clients_file: Path
    program: tuple[str, ...] = ("gpupool",)
    tls: tuple[Path, Path] | None = None
    """The server's certificate chain and key (PEM): it speaks TLS."""
    client_ca: str | None = None
    """The CA (PEM text) handed to clients in their Secret to check the server's certificate with."""
    enforce_compute: bool = False
    allow_plain: bool = False
    own_certificate: tuple[str, ...] = ()
    """This node's IP addresses: the agent asks the cluster's signer for the node's own certificate
    naming them (:mod:`gpupool.nodeagent.remote_certificate`, key and certificate in the clients
    file's directory) and serves TLS with it instead of ``tls``."""
    cublas: str | None = None
    """NVIDIA's ``libcublas.so.12`` for the server (``--cublas``); None: the server looks for one."""

    @property
    def certificate_dir(self) -> Path:
        return self.clients_file.parent

    def command(self) -> list[str]:
        """The server's command line."""
        tls = self.tls
        if self.own_certificate:
            tls = (self.certificate_dir / CERT_FILE, self.certificate_dir / KEY_FILE)
        return server_command(self.listen, self.clients_file, self.program, tls=tls,
                              enforce_compute=self.enforce_compute, allow_plain=self.allow_plain,
                              cublas=self.cublas)


def write_secret(core_v1: Any, manifest: dict[str, Any]) -> None:
    """Create the Secret, or patch it when it exists (409)."""
    from kubernetes.client.exceptions import ApiException

    meta = manifest["metadata"]
    try:
        core_v1.create_namespaced_secret(meta["namespace"], manifest)
    except ApiException as exc:
        if exc.status != 409:
            raise
        core_v1.patch_namespaced_secret(meta["name"], meta["namespace"], manifest)


async def publish_on_change(changed: asyncio.Event, every_s: float, publish: Callable[[], object]) -> None:
    """Run ``publish`` (in a thread) after each change of ``changed`` and every ``every_s`` anyway,
    until cancelled.

    The wait is ``asyncio.timeout``, not ``asyncio.wait_for``: Python 3.11's ``wait_for`` returns the
    event's result, dropping a cancellation that arrives in the same turn of the loop as the event
    is set, and this loop then never ended (the agent's stop hung; seen in an e2e run)."""
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every_s):
                await changed.wait()
        changed.clear()
        await asyncio.to_thread(publish)


async def obtain_certificate(keeper: ServerCertificate, retry_s: float = CERTIFICATE_RETRY_S,
                             most_s: float = CERTIFICATE_RETRY_MAX_S) -> None:
    """Ask for the node's certificate until it is issued, each failure logged: asked again after
    ``retry_s``, or after a denial as a new request after :func:`retry_after` (``retry_s`` doubling
    up to ``most_s`` while the denials go on)."""
    denials = 0
    while True:
        try:
            await asyncio.to_thread(keeper.obtain)
            return
        except CertificateDenied as exc:
            denials += 1
            pause = retry_after(denials, retry_s, most_s)
            log.error("remote GPU: no serving certificate for this node: %s; asking again with a new request "
                      "in %g s", exc, pause)
        except CertificateRefused as exc:
            pause = retry_s
            log.error("remote GPU: no serving certificate for this node: %s; asking again in %g s", exc, pause)
        except Exception as exc:  # an API error: the same
            pause = retry_s
            log.error("remote GPU: cannot ask for this node's serving certificate: %s; asking again in %g s",
                      exc, pause)
        await asyncio.sleep(pause)


async def keep_certificate(keeper: ServerCertificate, server: ServerProcess, *, retry_s: float = CERTIFICATE_RETRY_S,
                           now: Callable[[], float] = time.time) -> None:
    """Renew the node's certificate when :meth:`ServerCertificate.due` says so (two thirds of its life)
    and tell the server to serve it to new connections (its clients connected already keep theirs),
    until cancelled."""
    while True:
        renew_at = keeper.renew_at()
        if renew_at is not None:
            await asyncio.sleep(max(0.0, renew_at.timestamp() - now()))
        reason = await asyncio.to_thread(keeper.due)
        if not reason:
            await asyncio.sleep(retry_s)  # woken early (a clock step): look again
            continue
        log.info("remote GPU: renewing this node's serving certificate: %s", reason)
        await obtain_certificate(keeper, retry_s)
        if server.reload():
            log.info("remote GPU: told the server to serve the renewed certificate to new connections")


async def run_remote_gpu(node: str, names: ResourceNames, options: RemoteGpuOptions, core_v1: Any,
                         *, publish_every_s: float = PUBLISH_EVERY_S, certificates_v1: Any = None) -> None:
    """Serve remote shares until cancelled (see the module docstring). With ``own_certificate`` the
    node's certificate is obtained first (the server starts only with it) and renewed while serving;
    its CA goes to the clients unless ``client_ca`` names one."""
    keeper = None
    client_ca = options.client_ca
    if options.own_certificate:
        if certificates_v1 is None:
            from kubernetes import client
            certificates_v1 = client.CertificatesV1Api(core_v1.api_client)
        keeper = ServerCertificate(certificates_v1, node, options.own_certificate, options.certificate_dir)
        reason = await asyncio.to_thread(keeper.due)
        if reason:
            log.info("remote GPU: asking for this node's serving certificate (%s)", reason)
            await obtain_certificate(keeper)
        client_ca = client_ca or keeper.ca_pem()
    clients = RemoteClients(node, names, options.clients_file)
    clients.apply()  # the server starts with the file (the tokens of a file found kept)
    secrets = TokenSecrets(clients, functools.partial(write_secret, core_v1), options.endpoint, client_ca)
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def tell(was_changed: bool) -> None:
        if was_changed:
            loop.call_soon_threadsafe(changed.set)

    stop = threading.Event()
    watch = ListWatch(f"pods served remotely by {node}", core_v1.list_pod_for_all_namespaces,
                      lambda items: tell(clients.replace(items)),
                      lambda kind, pod: tell(clients.event(kind, pod)), stop=stop, list_resource_version="0")
    watch.start()
    server = ServerProcess(options.command())

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(server.run())
            group.create_task(publish_on_change(changed, publish_every_s, secrets.publish))
            if keeper is not None:
                group.create_task(keep_certificate(keeper, server))
    finally:
        stop.set()
