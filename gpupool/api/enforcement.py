"""What a node says about enforcing GPU shares: the ``<domain>/enforcement-v1`` Node annotation.

A share (``gpu-mem``/``gpu-core``) is a promise to the other containers on the card: without a
backend that holds each container to its share (the interception library, MPS), a container
granted 4 GiB and 30 % can take the whole card. So a node agent that cannot enforce does not
advertise shares at all unless the admin said so (``--isolation none``), and says which case it is
in this annotation, written with the inventory:

* the extender places slices only on nodes whose notice says ``shares: true`` (whole cards need no
  enforcement: the card is the container's alone) and names the node's reason when it refuses;
* ``kubectl gpupool inspect`` shows the backend per node, so "shared but not enforced" is never a
  surprise.

A node without the annotation (an agent older than the notice, a node described by hand) keeps the
behaviour it had: shares allowed. The format is JSON and versioned in its name, like ``inventory-v1``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: At most this many characters of a node's reason are kept: it ends up in scheduler messages.
MAX_REASON = 300


class EnforcementNoticeError(ValueError):
    """An ``enforcement-v1`` annotation that is not the agent's JSON."""


@dataclass(frozen=True)
class EnforcementNotice:
    """``backend``: shim, mps or none; ``enforcing``: whether it holds containers to their shares;
    ``shares``: whether the node takes shared GPU requests at all; ``reason``: why, in one line."""

    backend: str
    enforcing: bool
    shares: bool
    reason: str = ""

    def shown(self) -> str:
        """One line for a person: ``shim (enforcing)``, ``none: shares not enforced (admin's choice)``."""
        if self.enforcing:
            return f"{self.backend} (enforcing)"
        if self.shares:
            return f"{self.backend}: shares NOT enforced ({self.reason or 'the admin chose no backend'})"
        return f"{self.backend}: cannot enforce shares, whole cards only ({self.reason or 'no backend'})"


def encode_notice(notice: EnforcementNotice) -> str:
    """The annotation's value."""
    return json.dumps({"backend": notice.backend, "enforcing": notice.enforcing, "shares": notice.shares,
                       "reason": notice.reason[:MAX_REASON]}, sort_keys=True, separators=(",", ":"))


def decode_notice(text: str) -> EnforcementNotice:
    """Read an annotation value back; :class:`EnforcementNoticeError` names what is wrong."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise EnforcementNoticeError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise EnforcementNoticeError("expected a JSON object")
    backend, enforcing, shares, reason = (raw.get(k) for k in ("backend", "enforcing", "shares", "reason"))
    if not isinstance(backend, str) or not backend:
        raise EnforcementNoticeError("'backend' must be a non-empty string")
    if not isinstance(enforcing, bool) or not isinstance(shares, bool):
        raise EnforcementNoticeError("'enforcing' and 'shares' must be true or false")
    if reason is not None and not isinstance(reason, str):
        raise EnforcementNoticeError("'reason' must be a string")
    return EnforcementNotice(backend[:32], enforcing, shares, _one_line(reason or ""))


def _one_line(text: str) -> str:
    """A reason fit for a scheduler message: one line, bounded (the extender's wire replaces a
    ``%`` in it, as in every text it passes on)."""
    return " ".join(text.split())[:MAX_REASON]
