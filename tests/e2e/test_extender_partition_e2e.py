"""A live extender leader cut from the apiserver in the middle of a burst of GPU pods.

The fail-over e2e kills the leader; here the leader keeps running and keeps serving kube-scheduler,
but its connection to the apiserver goes through :class:`PartitionProxy`, which the test cuts
(connections reset, the client learns at once) or black-holes (connections kept, nothing forwarded:
a real partition, which TCP does not notice). The follower talks to the apiserver directly.
Routing is deploy/'s, as in the fail-over e2e (:class:`LabelService`): the cut leader cannot take
its own label off, so kube-scheduler keeps reaching it until the new leader takes that label off.

What must hold (docs/extender.md, "High availability"):

* the cut leader stops acting as leader on its own clock, within the renew deadline of the cut
  (its /filter refuses, its /bind refuses without writing, its /readyz says "not the leader"),
  before the follower may lead;
* the follower takes the Lease once it expired and binds;
* at no sample do both replicas lead; after the relay heals the old leader stays a follower;
* every pod is bound, and no card holds more than its memory: requests the black hole held are
  delivered when it heals (as TCP would retransmit them), so a bind the old leader sent before it
  stepped down reaches the apiserver late, and the assignment check sees any double booking;
* none of the old leader's binds that reach the apiserver after the takeover binds a pod (the
  audit log's answers): the new leader fenced the waiting GPU pods before its term bound anything.

The times from the cut to the old leader refusing, to the follower leading and to its first bind
are printed (run with ``-s``) and quoted in docs/extender.md.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import NVIDIA_GPUMEM, ResourceNames
from gpupool.core.model import GpuCard
from gpupool.extender.lease import LeaseSettings
from gpupool.testenv.audit import read_audit_log
from gpupool.testenv.config import render_kubeconfig
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import ExtenderProcess, MakeNode, log_tail
from tests.e2e.label_service import LabelService
from tests.e2e.partition_proxy import BLACK_HOLE, CUT, PartitionProxy
from tests.e2e.test_extender_e2e import assignments, gpu_pod
from tests.e2e.test_extender_failover_e2e import bound_now, create_pods_on_a_thread, holder, route_scheduler_to_leader
from tests.e2e.test_extender_leader_label_e2e import replicas

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()
CARD_MIB = 16276
PODS = 160
CUT_AT = 40
"""Pods bound when the leader is cut."""
SETTINGS = LeaseSettings()  # the replicas run the shipped timings
STEP_DOWN_S = SETTINGS.renew_deadline + 1.0
"""The cut leader refuses within its renew deadline of the cut (its last renewal began before the
cut), plus a second for the probe's period and a loaded machine."""
TAKEOVER_S = 15.0
BIND_PROBE_S = 2.0
"""The longest the cut leader's bind refusal may take once its filter refused (it needs no bind
thread; before, it queued behind the binds in flight: 0.8 to 3.9 s more in the black hole)."""
AFTER_HEAL_S = 8.0
"""How long the old leader is watched after the relay healed (several of its retry periods)."""


def _get(url: str, body: bytes | None = None, timeout_s: float = 2.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def leading(replica: ExtenderProcess) -> bool:
    """Whether the replica acts as leader now: /readyz 200, or a new term catching up."""
    status, body = _get(replica.ready_url)
    return status == 200 or b"catching up" in body


@dataclass
class Watch:
    """Both replicas' leadership sampled every ``period_s`` on a thread, with the cut leader's
    filter asked until it refuses."""

    a: ExtenderProcess
    b: ExtenderProcess
    filter_body: bytes
    period_s: float = 0.1
    samples: list[tuple[float, bool, bool]] = field(default_factory=list)
    """(monotonic time, a leads, b leads)."""
    a_refused_at: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Watch:
        threading.Thread(target=self._run, name="leadership-watch", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            self.samples.append((now, leading(self.a), leading(self.b)))
            if self.a_refused_at is None:
                _, answer = _get(f"{self.a.url}/filter", self.filter_body)
                if b"does not bind now" in answer:
                    self.a_refused_at = time.monotonic()
            self.stop.wait(self.period_s)

    def first(self, who: str, since: float) -> float | None:
        """The first sample at or after ``since`` where ``who`` ("a" or "b") leads."""
        index = 1 if who == "a" else 2
        return next((s[0] for s in self.samples if s[0] >= since and s[index]), None)


@pytest.mark.parametrize("mode", [CUT, BLACK_HOLE])
def test_a_partitioned_leader_steps_down_on_its_own_clock_and_nothing_is_double_booked(
    mode: str, control_plane: ControlPlane, core_v1: client.CoreV1Api, kube_api_client: client.ApiClient,
    namespace: str, make_node: MakeNode, tmp_path: Path,
) -> None:
    nodes = []
    for _ in range(10):
        name = f"pt-{uuid.uuid4().hex[:6]}"
        cards = tuple(GpuCard(i, f"GPU-{name}-{i}", "Tesla-P100", CARD_MIB) for i in range(4))
        nodes.append(make_node(name, {"cpu": "64", "memory": "256Gi", "pods": "250", NVIDIA_GPUMEM: "1"},
                               annotations={NAMES.inventory: encode_inventory(Inventory(cards))}))
    sizes = [1024, 2048, 3072, 4069]
    assert sum(sizes[i % 4] for i in range(PODS)) < 0.8 * CARD_MIB * 4 * len(nodes)  # every pod fits

    proxy = PartitionProxy(control_plane.server.removeprefix("https://")).start()
    # the leader uses the audited identity: the apiserver's audit log says when each of its binds
    # arrived and how it was answered, late ones included
    audited_token = yaml.safe_load(control_plane.audited_kubeconfig.read_text())["users"][0]["user"]["token"]
    proxied = tmp_path / "kubeconfig-through-proxy"
    proxied.write_text(render_kubeconfig(proxy.server, audited_token, control_plane.ca_cert.read_bytes()))
    lease = f"pt-{uuid.uuid4().hex[:6]}"
    a, b = replicas(control_plane, core_v1, namespace, tmp_path, lease, "pt")
    a.kubeconfig = proxied  # only the leader's apiserver traffic crosses the relay
    coordination = client.CoordinationV1Api(kube_api_client)
    service = LabelService(core_v1, namespace, {f"replica-{who}": (f"127.0.0.1:{r.port}", f"{r.url}/syncz")
                                                for who, r in (("a", a), ("b", b))})
    probe = dict(gpu_pod("partition-probe", 1024))
    probe["metadata"] = {**probe["metadata"], "namespace": namespace, "uid": str(uuid.uuid4())}
    watch = Watch(a, b, json.dumps({"Pod": probe, "NodeNames": nodes}).encode())
    try:
        route_scheduler_to_leader(a, b, service, control_plane)
        creating = create_pods_on_a_thread(core_v1, namespace, sizes, PODS)
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 90
        while bound_now(core_v1, namespace, seen) < CUT_AT:
            assert time.monotonic() < deadline, f"only {len(seen)} pods bound before the cut"
            time.sleep(0.1)
        watch.start()
        deadline = time.monotonic() + 10
        while not watch.samples:  # a sample is two HTTP calls: slow on a loaded machine
            assert time.monotonic() < deadline, "no sample of the replicas' leadership"
            time.sleep(0.05)
        assert watch.first("a", 0.0) is not None, "the leader did not lead before the cut"
        cut = time.monotonic()
        proxy.cut() if mode == CUT else proxy.black_hole()
        at_cut = len(seen)

        while watch.a_refused_at is None:
            assert time.monotonic() - cut < 20, f"the cut leader still filters as leader:\n{log_tail(a.log_path)}"
            time.sleep(0.05)
        refused_s = watch.a_refused_at - cut
        # answered on the event loop, not behind the binds it took as leader, which may still wait
        # on the bind threads for their writes' time-out (a black hole answers nothing)
        status, answer = _get(f"{a.url}/bind", json.dumps({
            "PodName": "partition-probe", "PodNamespace": namespace, "PodUID": probe["metadata"]["uid"],
            "Node": nodes[0]}).encode(), timeout_s=BIND_PROBE_S)
        bind_refused_s = time.monotonic() - cut
        assert status == 200 and b"not the leader" in answer, answer  # refused, nothing written
        assert bind_refused_s - refused_s <= BIND_PROBE_S, bind_refused_s

        b_binds = 0.0
        while holder(coordination, "default", lease) != "pt-b":
            assert time.monotonic() - cut < 30, f"no takeover 30 s after the cut:\n{log_tail(b.log_path)}"
            time.sleep(0.1)
        took_over, took_over_wall = time.monotonic(), time.time()
        first_b_bind = None
        while first_b_bind is None:  # heal once the new leader bound a pod (old binds may still be held)
            b_binds = b.metric("gpupool_extender_requests_total", verb="bind", outcome="ok")
            if b_binds > 0:
                first_b_bind = time.monotonic()
            assert time.monotonic() - took_over < 30, f"the new leader bound nothing:\n{log_tail(b.log_path)}"
            time.sleep(0.05)
        proxy.heal()
        healed = time.monotonic()

        creating.join(60)
        deadline = healed + 60
        while bound_now(core_v1, namespace, seen) < PODS and time.monotonic() < deadline:
            time.sleep(0.25)
        # held requests land; the old leader looks at the Lease again several times
        time.sleep(max(0.0, healed + AFTER_HEAL_S - time.monotonic()))
        watch.stop.set()
        b_led = watch.first("b", cut)
        late = Counter(r.code for r in read_audit_log(control_plane.audit_log)
                       if r.what == "create pods/binding" and r.namespace == namespace
                       and r.received >= took_over_wall)
        print(f"\npartition ({mode}): {at_cut} pods bound at the cut; the old leader refused filter "
              f"{refused_s:.1f} s and bind {bind_refused_s:.1f} s after it; Lease taken "
              f"{took_over - cut:.1f} s after it, the new leader "
              f"led by its /readyz {None if b_led is None else round(b_led - cut, 1)} s and bound its "
              f"first pod {first_b_bind - cut:.1f} s after it; healed {healed - cut:.1f} s after it; "
              f"{len(seen)}/{PODS} bound, the last {max(seen.values()) - cut:.1f} s after the cut; "
              f"relay {dict(proxy.stats)}; service {dict(service.stats)}; the old leader's binds received "
              f"after the takeover, by answer: {dict(late)}")

        assert refused_s <= STEP_DOWN_S, refused_s
        assert took_over - cut <= TAKEOVER_S, took_over - cut
        assert watch.a_refused_at < took_over  # stepped down before anyone may lead
        both = [s[0] - cut for s in watch.samples if s[1] and s[2]]
        assert not both, f"both replicas led at {both} s after the cut"
        assert watch.first("a", watch.a_refused_at) is None, "the old leader led again"
        a_log = a.log_path.read_text(errors="replace")
        assert a_log.count("pt-a is now the gpupool extender leader") == 1, log_tail(a.log_path)
        assert holder(coordination, "default", lease) == "pt-b"
        assert len(seen) == PODS, f"{PODS - len(seen)} pods unbound 60 s after the relay healed"
        pods = {p.metadata.name: p for p in core_v1.list_namespaced_pod(namespace).items}
        used: dict[tuple[str, int], int] = defaultdict(int)
        for name, assignment in assignments(core_v1, namespace).items():
            assert assignment.node == pods[name].spec.node_name, name  # bound where its cards are
            for ref in assignment.containers[0].cards:
                used[(assignment.node, ref.index)] += ref.memory_mib
        assert not {k: v for k, v in used.items() if v > CARD_MIB}, "a card is double-booked"
        # the new leader fenced the waiting GPU pods before binding: a late bind of the old leader
        # is refused (409) or dropped (504), never applied (gpupool/extender/takeover_fence.py)
        assert not late[201], late
        b_log = b.log_path.read_text(errors="replace")
        assert "fenced" in b_log and "against the previous leader's late binds" in b_log
    finally:
        watch.stop.set()
        service.stop()
        proxy.stop()
        for r in (a, b):
            r.kill()
        control_plane.restart_scheduler([])
