"""CPU of one event of the extender's pod watch: a status-only update against one that changes the pod.

    python3 bench/pod_watch.py --json
    python3 bench/pod_watch.py --pods 400 --rounds 21 --json

Why: every GPU pod of an end-to-end run reaches the watch at least three times (created, bound,
Running), and on KWOK (or a kubelet) the last ones change only the pod's status. This times what
the watch thread spends per event, in process: the event's JSON decoded as the watch decodes it
(:func:`gpupool.kube.json_decode.loads`), then applied to the cache (``apply_pod_event``: the
pod's record and its booking). ``--pods`` GPU pods of the bundled trace (those of
bench/e2e_scheduling.py), each as the apiserver shows it once bound (defaulted spec, managedFields,
conditions: about 3.3 kB of JSON, as in the e2e runs), are booked on nodes of the e2e bench's
machine; then, round after round, every pod gets two events of each kind in turn (a change, then
the change back):

* ``status_only``: KWOK's update, the status alone (phase ``Pending``/``Running`` in turn, new
  condition and managedFields times, a new resourceVersion);
* ``annotation``: the pod's ``assignment-v1`` written again with another time stamp (the same
  cards), a change of what the ledger reads, so the record must be read again;
* ``cpu_status_only``: the status-only update of a bound CPU-only pod (the ledger books its CPU and
  memory, so it is kept too).

Each figure is this thread's CPU (``time.thread_time``) per event, in microseconds: the median over
``--rounds`` rounds (the machine is shared), with ``decode_us`` the JSON alone, the same in every kind.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e_objects import common_shape, cpu_pods, gpu_pods, node_manifest, node_spec, pod_manifest
from gpupool.api.annotations import Assignment, encode_assignment
from gpupool.api.names import ResourceNames
from gpupool.core.model import Placement
from gpupool.extender.cache import ClusterCache
from gpupool.extender.watch import apply_pod_event
from gpupool.kube.json_decode import loads

NAMES = ResourceNames()
NAMESPACE = "bench"
START = dt.datetime(2026, 11, 28, 10, 0, tzinfo=dt.UTC)
KINDS = ("status_only", "annotation", "cpu_status_only")


def stamp(seconds: int) -> str:
    return (START + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def served(manifest: dict[str, Any], uid: str) -> dict[str, Any]:
    """The bench's pod as the apiserver returns it: the defaults it fills in and the creator's
    managedFields (status and node name come with each event)."""
    pod = copy.deepcopy(manifest)
    meta = pod["metadata"]
    meta.update(uid=uid, resourceVersion="1", creationTimestamp=stamp(0), managedFields=[
        {"manager": "e2e_scheduling.py", "operation": "Update", "apiVersion": "v1", "time": stamp(0),
         "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:containers": {
             'k:{"name":"main"}': {".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
                                   "f:resources": {".": {}, "f:limits": {}, "f:requests": {}},
                                   "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}},
             "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {},
             "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}}}}])
    spec = pod["spec"]
    token = {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}
    for container in spec["containers"]:
        container.update(imagePullPolicy="Always", terminationMessagePath="/dev/termination-log",
                         terminationMessagePolicy="File", volumeMounts=[
                             {"name": token["name"], "readOnly": True,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}])
    spec.update(volumes=[token], restartPolicy="Always", dnsPolicy="ClusterFirst", serviceAccountName="default",
                serviceAccount="default", securityContext={}, schedulerName="default-scheduler",
                tolerations=[{"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute",
                              "tolerationSeconds": 300} for taint in ("not-ready", "unreachable")],
                priority=0, enableServiceLinks=True, preemptionPolicy="PreemptLowerPriority")
    return pod


def at_status(pod: dict[str, Any], version: int, running: bool, node: str) -> dict[str, Any]:
    """``pod`` at resourceVersion ``version``, bound to ``node``, as KWOK leaves it (Running) or as it
    is just before (Pending, scheduled): status, kubelet's managedFields entry and the version change."""
    pod = copy.deepcopy(pod)
    when = stamp(version % 86_400)
    pod["metadata"]["resourceVersion"] = str(version)
    pod["metadata"]["managedFields"].append(
        {"manager": "kwok", "operation": "Update", "apiVersion": "v1", "time": when, "fieldsType": "FieldsV1",
         "fieldsV1": {"f:status": {"f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}}},
                                   "f:phase": {}, "f:podIP": {}, "f:startTime": {}}}, "subresource": "status"})
    pod["spec"]["nodeName"] = node
    ready = "True" if running else "False"
    conditions = [{"type": kind, "status": "True" if kind == "PodScheduled" else ready,
                   "lastProbeTime": None, "lastTransitionTime": when}
                  for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]
    status: dict[str, Any] = {"phase": "Running" if running else "Pending", "conditions": conditions,
                              "hostIP": "10.0.0.1", "podIP": "10.244.0.17", "podIPs": [{"ip": "10.244.0.17"}],
                              "startTime": stamp(1), "qosClass": "Burstable"}
    if running:
        status["containerStatuses"] = [
            {"name": c["name"], "ready": True, "restartCount": 0, "started": True, "image": c["image"],
             "imageID": "", "containerID": f"kwok://{pod['metadata']['uid']}-{c['name']}",
             "state": {"running": {"startedAt": when}}, "lastState": {}} for c in pod["spec"]["containers"]]
    pod["status"] = status
    return pod


def event_bytes(pod: dict[str, Any]) -> bytes:
    return json.dumps({"type": "MODIFIED", "object": pod}, separators=(",", ":")).encode()


def booked(cache: ClusterCache, pod: dict[str, Any], node: str, number: int) -> dict[str, Any]:
    """Book ``pod`` on ``node`` as a bind does, and return it with its assignment written."""
    key = f"{NAMESPACE}/{pod['metadata']['name']}"
    decision = cache.reserve(cache.requests.request(pod), node)
    if not isinstance(decision, Placement):
        raise SystemExit(f"{key} does not fit on {node}: {decision.reason}")
    spec = cache.node_spec_of(node)
    assert spec is not None
    assignment = Assignment.from_placement(decision, spec, START + dt.timedelta(seconds=number),
                                           pod_uid=pod["metadata"]["uid"])
    cache.commit(key, assignment)
    pod = copy.deepcopy(pod)
    pod["metadata"]["annotations"][NAMES.assignment] = encode_assignment(assignment)
    return pod


def prepare(pods: int) -> tuple[ClusterCache, dict[str, list[list[bytes]]]]:
    """The cache with every pod bound, and per kind two events per pod: a change and the change
    back (each round applies both, so every event of a kind finds the pod as the kind expects)."""
    shape = common_shape()
    names = [f"node-{i:05d}" for i in range(2 * pods)]  # a GPU pod and a CPU-only pod each
    cache = ClusterCache(NAMES)
    cache.replace_nodes([node_manifest(node_spec(name, shape), stamp(0)) for name in names])
    cache.replace_pods([])
    events: dict[str, list[list[bytes]]] = {kind: [[], []] for kind in KINDS}
    gpu = gpu_pods(pods, shape, len(names), seed=1).pods
    cpu = cpu_pods(pods, shape, seed=1).pods
    for i, (gpu_request, cpu_request) in enumerate(zip(gpu, cpu, strict=True)):
        node, cpu_node = names[i], names[pods + i]
        pod = served(pod_manifest(gpu_request, f"gpu-{i:05d}", NAMESPACE), f"uid-gpu-{i:05d}")
        apply_pod_event(cache, "ADDED", loads(event_bytes(pod))["object"])
        pod = booked(cache, pod, node, i)
        apply_pod_event(cache, "MODIFIED", loads(event_bytes(at_status(pod, 10, False, node)))["object"])
        rebooked = copy.deepcopy(pod)
        rebooked["metadata"]["annotations"][NAMES.assignment] = pod["metadata"]["annotations"][NAMES.assignment] \
            .replace(stamp(i)[:-1], stamp(i + 1)[:-1])
        assert rebooked["metadata"]["annotations"] != pod["metadata"]["annotations"]
        events["status_only"][0].append(event_bytes(at_status(pod, 20, True, node)))
        events["status_only"][1].append(event_bytes(at_status(pod, 21, False, node)))
        events["annotation"][0].append(event_bytes(at_status(rebooked, 30, False, node)))
        events["annotation"][1].append(event_bytes(at_status(pod, 31, False, node)))
        plain = served(pod_manifest(cpu_request, f"cpu-{i:05d}", NAMESPACE), f"uid-cpu-{i:05d}")
        apply_pod_event(cache, "ADDED", loads(event_bytes(at_status(plain, 10, False, cpu_node)))["object"])
        events["cpu_status_only"][0].append(event_bytes(at_status(plain, 20, True, cpu_node)))
        events["cpu_status_only"][1].append(event_bytes(at_status(plain, 21, False, cpu_node)))
    return cache, events


def per_event_us(events: list[bytes], work: Callable[[bytes], object]) -> float:
    started = time.thread_time_ns()
    for data in events:
        work(data)
    return (time.thread_time_ns() - started) / len(events) / 1000


def measure(pods: int, rounds: int) -> dict[str, Any]:
    cache, events = prepare(pods)
    booked_before = dict(cache.state.placements)

    def apply(data: bytes) -> None:
        event = loads(data)
        apply_pod_event(cache, event["type"], event["object"])

    spent: dict[str, list[float]] = {kind: [] for kind in (*KINDS, "decode")}
    for _ in range(rounds):
        for kind in KINDS:  # both events of the kind, so each kind starts where the last one left off
            spent[kind].append(per_event_us([*events[kind][0], *events[kind][1]], apply))
        spent["decode"].append(per_event_us([*events["status_only"][0], *events["status_only"][1]], loads))
    if cache.state.placements != booked_before:
        raise SystemExit("the events changed what the ledger books; the bench is broken")
    size = statistics.median(len(data) for data in events["status_only"][0])
    return {"pods": pods, "rounds": rounds, "event_bytes": int(size),
            **{f"{kind}_us": round(statistics.median(values), 1) for kind, values in spent.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.pods, args.rounds)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
