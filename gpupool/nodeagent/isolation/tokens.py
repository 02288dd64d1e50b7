"""Per-container registration tokens: HMAC(agent secret, pod UID + container name).

Why derived and not random per call: kubelet calls Allocate once per resource of a container and
merges the responses (the first value of a variable wins, a different one is only logged), so every
call for one container must hand out the same token. Deriving it from (pod UID, container) with a
secret makes it the same without any shared state between the calls, and the same again after an
agent restart because the secret is kept in the agent's state directory (mode 0600, never in a
directory mounted into a container). A container cannot forge another's token without the secret.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets

from gpupool.api.shim_contract import TOKEN_BYTES

SECRET_BYTES = 32
_SECRET_MODE = 0o600


class SecretError(OSError):
    """The secret file exists but cannot be used (wrong size, unreadable)."""


def load_or_create_secret(path: str) -> bytes:
    """The secret in ``path``; created (0600, atomically, once) when absent.

    Two agents starting together on one state directory both end up with the file's one value:
    the first ``O_EXCL`` create wins and the other reads what it wrote.
    """
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    fresh = secrets.token_bytes(SECRET_BYTES)
    tmp = f"{path}.{secrets.token_hex(8)}.tmp"  # unique per writer, thread or process
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _SECRET_MODE)
    try:
        os.write(fd, fresh)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails when the file exists: the first writer's secret stays
    except FileExistsError:
        pass
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    with open(path, "rb") as fh:
        secret = fh.read()
    if len(secret) != SECRET_BYTES:
        raise SecretError(f"{path}: {len(secret)} bytes, expected {SECRET_BYTES}; remove it to make a new one "
                          "(running containers then need a restart to register again)")
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, _SECRET_MODE)
    return secret


class TokenSigner:
    """Derives the token of (pod UID, container) from the agent's secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < SECRET_BYTES:
            raise ValueError(f"a secret of at least {SECRET_BYTES} bytes is needed")
        self._secret = secret

    def token(self, pod_uid: str, container: str) -> str:
        """64 hex digits, the same for the same (pod UID, container) and secret."""
        mac = hmac.new(self._secret, f"{pod_uid}\0{container}".encode(), hashlib.sha256)
        return mac.digest()[:TOKEN_BYTES].hex()
