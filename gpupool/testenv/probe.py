"""Tiny HTTP(S) readiness probes, with the standard library only.

The probes run before any kubeconfig exists and in the CLI, so they avoid the Kubernetes client.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path


def http_get(url: str, *, token: str | None = None, ca_cert: Path | None = None,
             verify: bool = True, timeout: float = 2.0) -> tuple[int, str]:
    """GET ``url`` and return ``(status, body)`` (see :func:`http_request`)."""
    return http_request(url, token=token, ca_cert=ca_cert, verify=verify, timeout=timeout)


def http_request(url: str, *, method: str = "GET", token: str | None = None,
                 ca_cert: Path | None = None, verify: bool = True,
                 timeout: float = 2.0) -> tuple[int, str]:
    """Send a body-less request and return ``(status, body)``; HTTP errors are returned, not raised.

    Connection errors raise ``OSError`` (callers polling a starting server treat it as "not yet").
    """
    context: ssl.SSLContext | None = None
    if url.startswith("https://"):
        if verify:
            context = ssl.create_default_context(cafile=str(ca_cert) if ca_cert else None)
        else:
            context = ssl._create_unverified_context()
    request = urllib.request.Request(url, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except urllib.error.URLError as exc:
        reason = exc.reason
        raise reason if isinstance(reason, OSError) else OSError(str(reason)) from exc


def is_ok(url: str, *, token: str | None = None, ca_cert: Path | None = None,
          verify: bool = True) -> bool:
    """Whether ``url`` answers 200 (used as a ``wait_until`` predicate)."""
    status, _ = http_get(url, token=token, ca_cert=ca_cert, verify=verify)
    return status == 200
