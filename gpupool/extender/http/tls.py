"""The extender's TLS: a serving certificate, client certificates verified against a CA, and
certificates replaced on disk taken up without a restart.

Why mutual TLS: whoever can POST ``/bind`` decides where GPU pods run (and writes their
assignment). kube-scheduler's extender client presents a client certificate (``tlsConfig.certFile``
/ ``keyFile``) and checks ours against ``caFile``; with ``--client-ca-file`` the handshake itself
refuses any client without a certificate signed by that CA, before a byte of HTTP is read.

Rotation: cert-manager (or the bootstrap, :mod:`gpupool.extender.http.certificates`) rewrites the
files of the mounted Secret. :class:`ReloadingTls` polls their ``stat`` (modification time, size
and inode: a Secret volume swaps a symlink, which changes the inode) and builds a fresh context when
they change. The context the server was started with never serves a connection itself: its SNI
callback, which OpenSSL runs for every ClientHello (with or without a server name), hands each new
handshake the current context. Connections already open keep theirs. A half-written set (a new
certificate beside the old key) fails to load; the old context stays and the next poll tries again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: How often the files are checked; cert-manager renews days before expiry, so seconds are plenty.
DEFAULT_RELOAD_INTERVAL_S = 10.0


class TlsConfigError(ValueError):
    """The certificate, key or CA files cannot be used (named, with OpenSSL's reason)."""


@dataclass(frozen=True)
class TlsFiles:
    """The flags Kubernetes components use: ``--tls-cert-file``, ``--tls-private-key-file``,
    ``--client-ca-file`` (optional: without it the server is TLS but clients are anonymous)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def paths(self) -> tuple[str, ...]:
        return (self.cert_file, self.key_file, *((self.client_ca_file,) if self.client_ca_file else ()))


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context for ``files``: TLS 1.2 or later, client certificates required when a client
    CA is given. Raises :class:`TlsConfigError` naming the file that failed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert_file, files.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load --tls-cert-file {files.cert_file} with --tls-private-key-file "
                             f"{files.key_file}: {exc}") from None
    if files.client_ca_file:
        try:
            context.load_verify_locations(cafile=files.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot load --client-ca-file {files.client_ca_file}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


FileStamp = tuple[tuple[int, int, int], ...]


def stamp(paths: tuple[str, ...]) -> FileStamp:
    """What tells a rewritten file from the one loaded: (mtime ns, size, inode) per path, through
    symlinks; a missing file stamps as zeros (and fails to load, keeping the old context)."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append((0, 0, 0))
            continue
        out.append((st.st_mtime_ns, st.st_size, st.st_ino))
    return tuple(out)


class ReloadingTls:
    """The serving context, re-read from :class:`TlsFiles` when they change."""

    def __init__(self, files: TlsFiles, interval_s: float = DEFAULT_RELOAD_INTERVAL_S) -> None:
        self.files = files
        self.interval_s = interval_s
        self._stamp = stamp(files.paths())
        self.current = server_context(files)  # a broken set at start-up is an error, not a warning
        self.reloads = 0
        self.failures = 0
        self.context = server_context(files)
        """The context to give the server: only its SNI callback is used, to pick :attr:`current`."""
        self.context.sni_callback = self._pick

    def _pick(self, connection: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None,
              _initial: ssl.SSLContext) -> None:
        connection.context = self.current

    def reload_if_changed(self) -> bool:
        """Re-read the files if their stamps moved; returns whether a new context is in use."""
        now = stamp(self.files.paths())
        if now == self._stamp:
            return False
        try:
            fresh = server_context(self.files)
        except TlsConfigError as exc:
            self.failures += 1
            log.warning("TLS files changed but do not load yet (kept the previous ones): %s", exc)
            return False
        self._stamp, self.current = now, fresh
        self.reloads += 1
        log.info("TLS certificate files changed: new connections use them")
        return True

    async def watch(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            self.reload_if_changed()
