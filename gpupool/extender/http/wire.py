"""The kube-scheduler extender v1 wire types (k8s.io/kube-scheduler/extender/v1), read and written.

Why hand-written: the Go types carry no JSON tags, so the field names on the wire are the Go names
(``Pod``, ``NodeNames``, ``FailedNodes`` ...) and Go's decoder matches them case-insensitively. We
read the same way (:func:`ci_get`) and always write the exact Go names. Pods and nodes inside are
ordinary Kubernetes JSON and are passed through as dicts.

Malformed documents raise :class:`WireError`; the HTTP layer answers those with 400 and an ``Error``.

Every text kube-scheduler shows (``FailedNodes``' reasons, a filter's or a bind's ``Error``) leaves
here without a ``%`` (:func:`format_safe`): kube-scheduler records the pod's ``FailedScheduling``
event with the message as the *format string* of Go's ``fmt`` (``Eventf(pod, ..., msg)`` with no
arguments), so ``30% c`` arrived as ``30%!c(MISSING)`` and ``%%`` as ``%``, while the pod's
``PodScheduled`` condition keeps the raw text: only a text without ``%`` reads the same in both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import orjson


class WireError(ValueError):
    """A request body that is not a valid extender document; the message names the field."""


SAFE_PERCENT = "\uff05"
"""FULLWIDTH PERCENT SIGN: what a ``%`` in a text gpupool does not write itself (a model name, an
annotation's value) becomes, so the text reads the same and Go's ``fmt`` leaves it alone. gpupool's
own reasons write "percent" instead."""


def format_safe(text: str) -> str:
    """``text`` without a ``%``, which kube-scheduler's Go ``fmt`` would take for a verb (module doc)."""
    return text.replace("%", SAFE_PERCENT) if "%" in text else text


def format_safe_reasons(reasons: dict[str, str]) -> dict[str, str]:
    """``reasons`` (node → reason) with :func:`format_safe` texts; the same dict when none has a ``%``
    (one join, no per-reason Python loop, on answers of up to one reason per node)."""
    if "%" not in "".join(reasons.values()):
        return reasons
    return {node: format_safe(reason) for node, reason in reasons.items()}


def ci_get(doc: Mapping[str, Any], name: str) -> Any:
    """``doc[name]`` matching the key case-insensitively (exact match first), None when absent."""
    if name in doc:
        return doc[name]
    lowered = name.lower()
    for key, value in doc.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


def _object(doc: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise WireError(f"{what}: expected a JSON object")
    return doc


def _pod(doc: Mapping[str, Any], what: str) -> dict[str, Any]:
    pod = ci_get(doc, "Pod")
    if pod is None:
        raise WireError(f"{what}: missing field Pod")
    if not isinstance(pod, dict):
        raise WireError(f"{what}.Pod: expected a Kubernetes Pod object")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise WireError(f"{what}.Pod: missing metadata.name")
    return pod


def _node_name(node: Any, where: str) -> str:
    if not isinstance(node, dict):
        raise WireError(f"{where}: expected a Kubernetes Node object")
    name = (node.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise WireError(f"{where}: missing metadata.name")
    return name


def _str_list(value: Any, where: str) -> list[str]:
    # "".join() checks that every item is a string in C, an order of magnitude faster than an
    # isinstance() per name, and this runs on thousands of names twice per pod.
    if not isinstance(value, list):
        raise WireError(f"{where}: expected a list of node names")
    try:
        "".join(value)
    except TypeError:
        raise WireError(f"{where}: expected a list of node names") from None
    return list(value)


# ---------------------------------------------------------------------------------- filter/prioritize
@dataclass(frozen=True)
class ExtenderArgs:
    """Arguments of filter and prioritize: the pod and the candidate nodes.

    Exactly one of ``nodes`` (full Node objects, ``nodeCacheCapable: false``) and ``node_names``
    (``nodeCacheCapable: true``) is set; ``node_names`` is always filled for convenience.
    """

    pod: dict[str, Any]
    node_names: list[str]
    nodes: list[dict[str, Any]] | None = None

    @property
    def node_cache_capable(self) -> bool:
        return self.nodes is None


def parse_extender_args(doc: Any) -> ExtenderArgs:
    """Read an ``ExtenderArgs`` document."""
    doc = _object(doc, "ExtenderArgs")
    pod = _pod(doc, "ExtenderArgs")
    node_list = ci_get(doc, "Nodes")
    names = ci_get(doc, "NodeNames")
    if node_list is not None:
        node_list = _object(node_list, "ExtenderArgs.Nodes")
        items = ci_get(node_list, "Items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise WireError("ExtenderArgs.Nodes.items: expected a list")
        node_names = [_node_name(n, f"ExtenderArgs.Nodes.items[{i}]") for i, n in enumerate(items)]
        return ExtenderArgs(pod=pod, node_names=node_names, nodes=list(items))
    if names is None:
        raise WireError("ExtenderArgs: needs Nodes or NodeNames")
    return ExtenderArgs(pod=pod, node_names=_str_list(names, "ExtenderArgs.NodeNames"))


@dataclass
class FilterResult:
    """``ExtenderFilterResult``; answers in the same mode (Nodes or NodeNames) the request used."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    error: str = ""

    def to_json(self, args: ExtenderArgs | None) -> dict[str, Any]:
        failed, error = format_safe_reasons(self.failed), format_safe(self.error)
        if args is not None and args.nodes is not None:
            keep = set(self.passed)
            items = [n for n in args.nodes if (n.get("metadata") or {}).get("name") in keep]
            return {"Nodes": {"metadata": {}, "items": items}, "NodeNames": None,
                    "FailedNodes": failed, "Error": error}
        return {"Nodes": None, "NodeNames": self.passed, "FailedNodes": failed, "Error": error}


def host_priority_list(scores: Mapping[str, int]) -> list[dict[str, Any]]:
    """``HostPriorityList``: ``[{"Host": name, "Score": 0..10}]``."""
    return [{"Host": host, "Score": int(score)} for host, score in scores.items()]


class HostPriorityEncoder:
    """Writes ``HostPriorityList`` JSON from per-host fragments remembered between calls.

    Why: the answer has one entry per node on every prioritize, and building a small dict per node
    for an encoder, or a Python loop joining a fragment and a score per host, costs more than the
    scoring. Here each host's ``{"Host":"…","Score":`` is encoded once (by orjson, so any name is
    escaped correctly), and an answer is those fragments interleaved with the scores' ``N},`` texts
    by two slice assignments and one join, about twice as fast (docs/extender.md, "Numbers behind
    the code"). kube-scheduler asks about the same nodes every time, so the memo stays the size of
    the cluster; it is emptied if it ever holds more than ``max_hosts``. Scores outside 0..10
    (never produced by the service) take a slower, exact path.

    The extender writes most answers faster still, from per-row records of the ledger's nodes
    (:mod:`gpupool.extender.http.host_records`); this encoder serves the answers that cannot be
    (a node the ledger does not know, names too uneven to pad, an error answer).
    """

    _SCORE_TEXTS: ClassVar[npt.NDArray[np.object_]] = np.array(
        [f"{score}}},".encode() for score in range(11)], dtype=object)

    def __init__(self, max_hosts: int = 100_000) -> None:
        self.max_hosts = max_hosts
        self._prefix: dict[str, bytes] = {}

    def encode(self, scores: Mapping[str, int]) -> bytes:
        """The JSON of :func:`host_priority_list` for ``scores``."""
        return self.encode_lists(list(scores), list(scores.values()))

    def encode_lists(self, hosts: Sequence[str], scores: Sequence[int] | npt.NDArray[np.int64]) -> bytes:
        """The JSON of :func:`host_priority_list` for ``scores[i]`` of ``hosts[i]``."""
        if not len(hosts):
            return b"[]"
        prefix = self._prefix
        try:
            fragments = list(map(prefix.__getitem__, hosts))
        except KeyError:  # a host seen for the first time
            if len(prefix) + len(hosts) > self.max_hosts:
                prefix.clear()
            for host in hosts:
                if host not in prefix:
                    prefix[host] = b'{"Host":' + orjson.dumps(host) + b',"Score":'
            fragments = list(map(prefix.__getitem__, hosts))
        values = np.asarray(scores)
        if values.dtype.kind in "iu" and len(values) and values.min() >= 0 and values.max() <= 10:
            texts = self._SCORE_TEXTS[values].tolist()
        else:
            texts = [b"%d}," % int(score) for score in values.tolist()]
        parts: list[bytes] = [b""] * (2 * len(fragments))
        parts[0::2] = fragments
        parts[1::2] = texts
        body = b"".join(parts)
        return b"[" + body[:-1] + b"]"


# -------------------------------------------------------------------------------------- bind
@dataclass(frozen=True)
class BindingArgs:
    """``ExtenderBindingArgs``."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def parse_binding_args(doc: Any) -> BindingArgs:
    """Read an ``ExtenderBindingArgs`` document."""
    doc = _object(doc, "ExtenderBindingArgs")
    values: dict[str, str] = {}
    for name in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = ci_get(doc, name)
        if value is None and name == "PodUID":
            value = ""
        if not isinstance(value, str) or (not value and name != "PodUID"):
            raise WireError(f"ExtenderBindingArgs: missing or empty field {name}")
        values[name] = value
    return BindingArgs(pod_name=values["PodName"], pod_namespace=values["PodNamespace"],
                       pod_uid=values["PodUID"], node=values["Node"])


def binding_result(error: str) -> dict[str, Any]:
    """``ExtenderBindingResult`` (kube-scheduler shows a refusal in the pod's events: no ``%``)."""
    return {"Error": format_safe(error)}


# ----------------------------------------------------------------------------------- preempt
@dataclass(frozen=True)
class PreemptionArgs:
    """``ExtenderPreemptionArgs``: per node, the uids of the victims kube-scheduler proposes."""

    pod: dict[str, Any]
    victims: dict[str, list[str]]
    pdb_violations: dict[str, int]


def parse_preemption_args(doc: Any) -> PreemptionArgs:
    """Read an ``ExtenderPreemptionArgs`` document (either NodeNameToMetaVictims or NodeNameToVictims)."""
    doc = _object(doc, "ExtenderPreemptionArgs")
    pod = _pod(doc, "ExtenderPreemptionArgs")
    meta = ci_get(doc, "NodeNameToMetaVictims")
    full = ci_get(doc, "NodeNameToVictims")
    source = meta if meta is not None else full
    if source is None:
        source = {}
    source = _object(source, "ExtenderPreemptionArgs.NodeNameToVictims")
    victims: dict[str, list[str]] = {}
    violations: dict[str, int] = {}
    for node, entry in source.items():
        where = f"ExtenderPreemptionArgs victims of {node}"
        entry = _object(entry, where)
        pods = ci_get(entry, "Pods") or []
        if not isinstance(pods, list):
            raise WireError(f"{where}.Pods: expected a list")
        uids: list[str] = []
        for i, victim in enumerate(pods):
            victim = _object(victim, f"{where}.Pods[{i}]")
            uid = ci_get(victim, "UID") if meta is not None else (victim.get("metadata") or {}).get("uid")
            if not isinstance(uid, str) or not uid:
                raise WireError(f"{where}.Pods[{i}]: missing uid")
            uids.append(uid)
        victims[str(node)] = uids
        count = ci_get(entry, "NumPDBViolations") or 0
        violations[str(node)] = int(count) if isinstance(count, int) else 0
    return PreemptionArgs(pod=pod, victims=victims, pdb_violations=violations)


def preemption_result(victims: Mapping[str, list[str]], violations: Mapping[str, int]) -> dict[str, Any]:
    """``ExtenderPreemptionResult`` (always in the meta form, which kube-scheduler accepts in both modes)."""
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": violations.get(node, 0)}
        for node, uids in victims.items()
    }}
