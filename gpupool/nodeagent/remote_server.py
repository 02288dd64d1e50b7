"""The GPU node's side of remote shares: who its GPU server serves, with which token, in its clients file.

A remote share is booked by the extender on a card of this node for a pod bound to another node
(``<domain>/remote-share-v1`` names this node as ``server``, :mod:`gpupool.api.remote_share`). This
module turns the pods that name this node into the GPU server's clients file
(``{"version": 1, "clients": [{"token", "pod", "card_uuid", "memory_mib", "compute_percent"}]}``,
the data plane's contract) and keeps one token per pod:

* a pod is served while it exists, is bound, has not finished and its share was decided for it
  (the share's ``podUID`` is the pod's uid): a deleted or finished pod leaves the file at the next
  change, so the server drops its client and the booking ends with the pod in the extender;
* a token is random (``secrets.token_urlsafe(32)``: 43 URL-safe characters, 256 bits), made for
  one pod uid and never reused: a pod recreated under the same name gets a new one;
* the file is replaced atomically (written beside it, then renamed) with mode 0600: the server
  never reads half a file and no other user of the node reads the tokens.

How the pod gets its token (:func:`token_secret`): a Secret named ``<pod>-gpupool-remote`` in the
pod's namespace, owned by the pod (deleted with it), holding ``remote_endpoint`` and
``remote_token``, the grant-file keys of the client library. Threat model: the token is the only
credential between client and server; whoever can read Secrets of the pod's namespace can use the
pod's share (as they could read any of its other Secrets), nobody else can, and a token grants only
its pod's share on its card, within that share's limits (the server enforces them). See
docs/remote-gpu.md, "Scheduling a remote share".
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.api.annotations import AnnotationError
from gpupool.api.names import ResourceNames
from gpupool.api.remote_gpu import ClientsFileError, RemoteClient, decode_clients, encode_clients
from gpupool.api.remote_share import decode_remote_share
from gpupool.files.replace import replace_file

TOKEN_BYTES = 32
"""Random bytes per token; URL-safe base64 makes 43 characters of them."""
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
SECRET_SUFFIX = "-gpupool-remote"


@dataclass(frozen=True)
class ServedShare:
    """One pod this node's GPU server serves: its key, uid, card and limits."""

    pod: str
    """``namespace/name``."""
    pod_uid: str
    card_uuid: str
    memory_mib: int
    compute_percent: int
    """Per cent of the card's compute, rounded down (0: no compute limit, a memory-only share)."""
    more_card_uuids: tuple[str, ...] = ()
    """A share of several cards: the client's devices 1, 2, ... (the same slice on each)."""


def served_shares(pods: Iterable[Mapping[str, Any]], node: str, names: ResourceNames) -> list[ServedShare]:
    """The shares of ``pods`` booked on this ``node``'s cards, sorted by pod (see the module
    docstring for which pods count); a share that does not decode is skipped (the extender refuses
    it too: its cards are not known)."""
    found: list[ServedShare] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(names.remote_share)
        if not isinstance(text, str) or names.assignment in (meta.get("annotations") or {}):
            continue
        if not (pod.get("spec") or {}).get("nodeName") or (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            continue
        try:
            share = decode_remote_share(text)
        except AnnotationError:
            continue
        uid = str(meta.get("uid") or "")
        if share.server != node or not uid or (share.pod_uid and share.pod_uid != uid) or not share.card.memory_mib:
            continue  # another node's, another pod's, or no memory (refused at the request: never written)
        # The clients file holds one limit for all of a client's cards: the smallest booking (a share
        # proportional to cards of different sizes is booked differently on each), never more than
        # any card holds for it.
        found.append(ServedShare(pod=f"{meta.get('namespace')}/{meta.get('name')}", pod_uid=uid,
                                 card_uuid=share.card.uuid, memory_mib=min(c.memory_mib for c in share.cards),
                                 compute_percent=min(c.compute for c in share.cards) // 10,
                                 more_card_uuids=tuple(c.uuid for c in share.more_cards)))
    return sorted(found, key=lambda s: s.pod)


class TokenBook:
    """One random token per served pod uid, forgotten when the pod is no longer served."""

    def __init__(self) -> None:
        self._tokens: dict[str, str] = {}

        self._earlier: dict[tuple[str, str], str] = {}

    def tokens(self, shares: Iterable[ServedShare]) -> dict[str, str]:
        """Token per pod uid of ``shares``: kept for pods already served, a token of the clients
        file the agent found at its start for the same pod and card (:meth:`adopt`), else new."""
        current: dict[str, str] = {}
        for share in shares:
            token = self._tokens.get(share.pod_uid) or self._earlier.pop((share.pod, share.card_uuid), None)
            current[share.pod_uid] = token or secrets.token_urlsafe(TOKEN_BYTES)
        self._tokens = current
        return dict(current)

    def adopt(self, text: str) -> None:
        """Take the tokens of a clients file written before a restart, so the clients already
        connected keep theirs (matched by pod and card; ignored when the file does not read)."""
        try:
            self._earlier = {(c.pod, c.card_uuid): c.token for c in decode_clients(text)}
        except ClientsFileError:
            self._earlier = {}


def clients_text(shares: Iterable[ServedShare], tokens: Mapping[str, str]) -> str:
    """The clients file of the GPU server (:func:`gpupool.api.remote_gpu.encode_clients`), one
    entry per share."""
    return encode_clients(RemoteClient(token=tokens[s.pod_uid], pod=s.pod, card_uuid=s.card_uuid,
                                       memory_mib=s.memory_mib, compute_percent=s.compute_percent,
                                       more_card_uuids=s.more_card_uuids)
                          for s in shares)


def write_clients_file(path: Path, text: str) -> bool:
    """Replace ``path`` with ``text`` atomically, mode 0600; False (nothing written) when it holds
    ``text`` already.

    A missing directory (a fresh ``--state-dir`` on a host, where no hostPath mount made it) is
    created, 0700 as the file holds tokens: without it the first write failed and took the whole
    agent down with it."""
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    replace_file(path, text, mode=0o600)  # the tokens are secrets
    return True


CA_KEY = "remote_tls_ca.pem"
"""The Secret's key holding the CA a client checks the server against (a file once the Secret is
mounted: the client library's ``GPUPOOL_REMOTE_TLS_CA`` names it)."""


def token_secret(share: ServedShare, token: str, endpoint: str, client_ca: str | None = None) -> dict[str, Any]:
    """The Secret that hands ``share``'s pod its endpoint and token (and, when the server speaks TLS,
    the CA to check it with), owned by the pod (garbage collected with it)."""
    namespace, name = share.pod.split("/", 1)
    data = {"remote_endpoint": endpoint, "remote_token": token}
    if client_ca is not None:
        data[CA_KEY] = client_ca
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": f"{name}{SECRET_SUFFIX}", "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "gpupool-node-agent"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": share.pod_uid}]},
        "stringData": data,
    }


class RemoteClients:
    """The pods a GPU node serves remotely, kept from a list+watch of pods, and the clients file
    rewritten on every change that alters it (:meth:`apply` returns whether it did). The watch's
    thread changes it, the agent's loop reads :meth:`snapshot`: a lock keeps the two consistent."""

    def __init__(self, node: str, names: ResourceNames, path: Path) -> None:
        self.node = node
        self.names = names
        self.path = path
        self.tokens = TokenBook()
        with contextlib.suppress(OSError):
            self.tokens.adopt(path.read_text())
        self._pods: dict[str, Mapping[str, Any]] = {}
        self.served: list[ServedShare] = []
        self.issued: dict[str, str] = {}
        """Token per served pod uid, as written in the file."""
        self._lock = threading.Lock()

    def snapshot(self) -> tuple[list[ServedShare], dict[str, str]]:
        """The pods served and their tokens, as last written."""
        with self._lock:
            return list(self.served), dict(self.issued)

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> bool:
        """A full list of pods (the watch's list)."""
        with self._lock:
            self._pods = {self._key(p): p for p in pods if self._mine(p)}
            return self._apply()

    def event(self, kind: str, pod: Mapping[str, Any]) -> bool:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``)."""
        with self._lock:
            if kind == "DELETED" or not self._mine(pod):
                self._pods.pop(self._key(pod), None)
            else:
                self._pods[self._key(pod)] = pod
            return self._apply()

    def apply(self) -> bool:
        """Write the clients file for the pods known now; True when its contents changed."""
        with self._lock:
            return self._apply()

    def _apply(self) -> bool:
        self.served = served_shares(self._pods.values(), self.node, self.names)
        self.issued = self.tokens.tokens(self.served)
        return write_clients_file(self.path, clients_text(self.served, self.issued))

    def _mine(self, pod: Mapping[str, Any]) -> bool:
        """Whether the pod carries a remote share at all (only those are kept: the watch sees every
        pod of the cluster)."""
        return self.names.remote_share in ((pod.get("metadata") or {}).get("annotations") or {})

    @staticmethod
    def _key(pod: Mapping[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"
