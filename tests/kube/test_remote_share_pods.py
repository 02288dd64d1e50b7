"""What a remote-share pod holds as the extender and the kubectl plugin read it
(gpupool/kube/pod_holding.py): the slice on the server node, nothing on its own."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpupool.api.annotations import CardRef
from gpupool.api.names import ResourceNames
from gpupool.api.remote_share import RemoteShare, encode_remote_share
from gpupool.core.model import CardSlice, ContainerAssignment, NodeSpec, Placement
from gpupool.kube.pod_holding import HoldingKind, holding, pod_record
from gpupool.kube.translate import node_spec
from tests.kube.builders import container, node, pod

NAMES = ResourceNames()
NOW = 1_000_000.0
SPECS = {"gpu": node_spec(node("gpu", [16276]), NAMES), "cpu": node_spec(node("cpu"), NAMES)}
ASK = {"gpupool.io/remote-gpu": "true"}


def share(server: str = "gpu", uid: str = "uid-default-p") -> str:
    when = dt.datetime.fromtimestamp(NOW, dt.UTC)
    return encode_remote_share(RemoteShare(server=server, time=when, container="main", pod_uid=uid,
                                           card=CardRef(0, f"GPU-{server}-0", 4000, 0)))


def remote_pod(*, node_name: str = "", written: str | None = None, phase: str = "Pending") -> dict[str, Any]:
    notes = {**ASK, **({"gpupool.io/remote-share-v1": written} if written else {})}
    return pod("p", container(mib=4000, cpu="1"), node_name=node_name, annotations=notes, phase=phase)


def held(raw: dict[str, Any], specs: dict[str, NodeSpec] = SPECS) -> Any:
    found = pod_record(raw, NAMES)
    assert found is not None
    return holding(found, specs.get, now=NOW, unconfirmed_timeout_s=60.0)


def test_a_bound_remote_pod_holds_the_slice_on_the_server_and_nothing_on_its_node() -> None:
    got = held(remote_pod(node_name="cpu", written=share()))
    assert got.kind is HoldingKind.PLACEMENT and got.bound
    assert got.placement == Placement("default/p", "gpu", 0, 0, containers=(
        ContainerAssignment("main", (CardSlice(0, 4000, 0),)),))


def test_a_written_share_holds_its_card_while_the_bind_is_in_flight_then_expires() -> None:
    assert held(remote_pod(written=share())).kind is HoldingKind.PLACEMENT
    found = pod_record(remote_pod(written=share()), NAMES)
    assert found is not None
    late = holding(found, SPECS.get, now=NOW + 61, unconfirmed_timeout_s=60.0)
    assert late.kind is HoldingKind.EXPIRED


def test_a_finished_pod_or_a_gone_server_holds_nothing() -> None:
    assert held(remote_pod(node_name="cpu", written=share(), phase="Succeeded")).kind is HoldingKind.NOTHING
    gone = held(remote_pod(node_name="cpu", written=share()), {"cpu": SPECS["cpu"]})
    assert gone.kind is HoldingKind.UNKNOWN_NODE and gone.placement is None


def test_a_share_decided_for_another_pod_is_not_booked() -> None:
    got = held(remote_pod(node_name="cpu", written=share(uid="uid-of-someone-else")))
    assert got.kind is HoldingKind.UNREADABLE and got.placement is not None and got.placement.node == "cpu"
    assert got.problem is not None and "decided for pod uid uid-of-someone-else" in got.problem
