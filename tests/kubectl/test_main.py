"""The command itself, with the cluster reads replaced by hand-made objects."""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from gpupool.api.cluster_settings import AGENT_SETTINGS_ANNOTATION, ClusterSettings
from gpupool.api.usage_report import CardUsageReport, NodeUsageReport, encode_usage_report
from gpupool.kubectl import connection as kube
from gpupool.kubectl.main import cli, scheduler_message
from tests.extender.tenancy_world import quota
from tests.kubectl.objects import assignment, claim_pod, dra_claim, gpu_node, gpu_pod, placed

NODES = [gpu_node("a", [16384])]
PODS = [placed("holder", "a", 0, 60), gpu_pod("waiting", 32), placed("small", "a", 0, 1, container="c")]
GROUPS: list[dict[str, Any]] = []
QUOTAS: list[dict[str, Any]] = []
LEASES: list[dict[str, Any]] = []
CLAIMS: list[dict[str, Any]] = []
CLUSTER_CONFIG = {"resourceDomain": "gpupool.io", "gpushareMemoryUnit": "GiB"}
"""What the cluster's ConfigMap gpupool-system/gpupool-cluster holds (docs/cluster-config.md)."""


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Fake reads; returns the (namespace, name) of every pod read."""
    asked: list[tuple[str, str]] = []

    def read_pod(_: kube.Connection, namespace: str, name: str) -> dict[str, Any]:
        asked.append((namespace, name))
        found = [p for p in PODS if p["metadata"]["name"] == name]
        if not found:
            raise kube.ClusterAccessError(f"cannot read pod {namespace}/{name}: 404 Not Found")
        return found[0]

    monkeypatch.setattr(kube, "connect", lambda kubeconfig, context: kube.Connection(api=None, namespace="team"))
    monkeypatch.setattr(kube, "list_nodes", lambda _: NODES)
    monkeypatch.setattr(kube, "list_pods", lambda _: PODS)
    monkeypatch.setattr(kube, "list_claims", lambda _: CLAIMS)
    monkeypatch.setattr(kube, "read_pod", read_pod)
    monkeypatch.setattr(kube, "read_node_proxy", read_node_proxy)
    monkeypatch.setattr(kube, "list_custom", lambda _, group, version, plural: {
        "resourcegroups": GROUPS, "gpuquotas": QUOTAS}[plural])
    monkeypatch.setattr(kube, "read_namespace", lambda _, name: {"metadata": {"name": name}})
    monkeypatch.setattr(kube, "list_leases", lambda _, namespace, selector: LEASES)
    monkeypatch.setattr(kube, "read_config_map", lambda _, namespace, name: {"data": dict(CLUSTER_CONFIG)})
    return asked


def read_node_proxy(_: kube.Connection, node: str, port: int, path: str, timeout_s: float) -> str:
    """The agent of node a on port 9410 reports its card; any other port is an agent nobody runs."""
    if (node, port, path) != ("a", 9410, "usage.json"):
        raise kube.ClusterAccessError("503 Service Unavailable: error trying to reach service: connection refused")
    return encode_usage_report(NodeUsageReport("a", "proc-scan", 600.0, (CardUsageReport(
        0, "GPU-a-0", "Tesla-T4", "busy", 61, 9000, 16384, 2, 0.0),), ()))


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_inspect_prints_the_table(cluster: list[tuple[str, str]]) -> None:
    result = run("inspect")
    assert result.exit_code == 0, result.output
    assert "team/holder/main (15360MiB, 0%)" in result.output


def test_inspect_reads_usage_from_the_node_agent(cluster: list[tuple[str, str]]) -> None:
    result = run("inspect")
    assert result.output.splitlines()[1].split()[7:9] == ["61%", "9000MiB"]


def test_inspect_of_an_unreachable_agent_shows_a_dash_and_a_note(cluster: list[tuple[str, str]]) -> None:
    result = run("inspect", "--agent-port", "9500")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1].split()[7] == "-"
    assert result.output.splitlines()[-1] == ("node a: usage not read from the node agent (port 9500): 503 "
                                              "Service Unavailable: error trying to reach service: connection refused")


def test_inspect_with_agent_port_0_asks_no_agent(cluster: list[tuple[str, str]],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "read_node_proxy", None)  # would raise if called
    result = run("inspect", "--agent-port", "0")
    assert result.exit_code == 0 and result.output.splitlines()[1].split()[7] == "-"


def test_inspect_json(cluster: list[tuple[str, str]]) -> None:
    doc = json.loads(run("inspect", "a", "-o", "json").output)
    assert doc["nodes"][0]["cards"][0]["memoryMiB"] == {"booked": 15616, "total": 16384}


def test_inspect_of_an_unknown_node_fails_clearly(cluster: list[tuple[str, str]]) -> None:
    result = run("inspect", "nope")
    assert result.exit_code == 1 and "node nope not found" in result.output


def test_why_reads_the_pod_in_the_contexts_namespace_and_explains(cluster: list[tuple[str, str]]) -> None:
    result = run("why", "waiting")
    assert cluster == [("team", "waiting")]
    assert result.output.splitlines()[:2] == ["pod team/waiting fits on none of 1 node:",
                                              "  1 node: no single card has 8192 MiB free"]


def test_why_of_a_bound_pod_points_at_inspect(cluster: list[tuple[str, str]]) -> None:
    result = run("why", "holder", "-n", "other")
    assert cluster == [("other", "holder")]
    assert result.output.strip() == "pod team/holder is already bound to node a; see: kubectl gpupool inspect a"


def test_why_of_a_missing_pod_fails_clearly(cluster: list[tuple[str, str]]) -> None:
    result = run("why", "ghost")
    assert result.exit_code == 1 and "404 Not Found" in result.output


def test_an_unloadable_kubeconfig_is_a_clear_error(tmp_path: Any) -> None:
    result = run("inspect", "--kubeconfig", str(tmp_path / "missing"))
    assert result.exit_code == 1 and "cannot load the kubeconfig" in result.output


def test_kube_schedulers_word_is_its_pod_scheduled_condition() -> None:
    pod = {"status": {"conditions": [{"type": "Ready", "status": "False", "message": "x"},
                                     {"type": "PodScheduled", "status": "False", "message": "0/3 nodes"}]}}
    assert scheduler_message(pod) == "0/3 nodes"
    assert scheduler_message({}) is None


def test_why_applies_the_namespaces_quota(cluster: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "QUOTAS", [quota("team", hard={"gpuMemory": "1Gi"})])
    result = run("why", "waiting")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("pod team/waiting fits on no node: GpuQuota team/gpus")


def test_why_refuses_a_node_whose_agent_lease_lapsed(cluster: list[tuple[str, str]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    monkeypatch.setattr(sys.modules[__name__], "LEASES", [{"metadata": {"name": "gpupool-agent-a"}, "spec": {
        "holderIdentity": "a", "leaseDurationSeconds": 40, "renewTime": old}}])
    result = run("why", "waiting")
    assert result.output.splitlines()[1] == "  1 node: node agent on a last renewed 600 s ago (lease 40 s)"


def test_why_without_lease_is_refused_only_when_the_extender_requires_one(cluster: list[tuple[str, str]]) -> None:
    assert "no gpupool node agent lease" not in run("why", "waiting").output
    assert "1 node: node a has no gpupool node agent lease" in run("why", "waiting", "--require-agent-lease").output


def test_what_cannot_be_read_is_a_note_not_an_error(cluster: list[tuple[str, str]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*_: Any) -> Any:
        raise kube.ClusterAccessError("cannot read gpuquotas.gpupool.io: 403 Forbidden")

    monkeypatch.setattr(kube, "list_custom", forbidden)
    result = run("why", "waiting", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["notes"] == ["resource groups, GPU quotas and pools not applied: cannot read gpuquotas.gpupool.io: "
                            "403 Forbidden"]
    assert doc["groups"][0]["reason"] == "no single card has 8192 MiB free"


def test_a_missing_crd_means_no_such_objects(cluster: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    def not_served(*_: Any) -> Any:
        raise kube.NotServedError("cannot read resourcegroups.gpupool.io: 404 Not Found")

    monkeypatch.setattr(kube, "list_custom", not_served)
    doc = json.loads(run("why", "waiting", "-o", "json").output)
    assert doc["notes"] == [] and doc["policy"] == "gpupool"


def test_a_node_whose_agent_counts_gpushare_memory_otherwise_is_shown_refused(
        cluster: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """inspect and why show the extender's reason for a node whose agent published other settings,
    compared with the ConfigMap's values (docs/cluster-config.md)."""
    differing = gpu_node("b", [16384])
    differing["metadata"]["annotations"][AGENT_SETTINGS_ANNOTATION] = ClusterSettings(
        gpushare_memory_unit="MiB").published()
    monkeypatch.setattr(kube, "list_nodes", lambda _: [*NODES, differing])
    words = "node b counts gpushare memory (aliyun.com/gpu-mem) in MiB, the cluster configuration in GiB"
    doc = json.loads(run("why", "waiting", "-o", "json").output)
    assert any(words in n["reason"] for group in doc["groups"] for n in group["nodes"]), doc
    inspected = run("inspect", "b", "--agent-port", "0")
    assert inspected.exit_code == 0 and "counts gpushare memory" in inspected.output


def test_the_config_maps_domain_reads_the_pods_and_a_missing_config_map_is_a_note(
        cluster: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(CLUSTER_CONFIG, "resourceDomain", "other.io")
    result = run("why", "waiting")
    assert result.exit_code == 0 and "asks for no gpupool resource" in result.output  # gpupool.io/gpu-mem: not ours

    def none(*_: Any) -> Any:
        raise kube.NotServedError("cannot read ConfigMap gpupool-system/gpupool-cluster: 404 Not Found")

    monkeypatch.setattr(kube, "read_config_map", none)
    result = run("why", "waiting")
    assert result.exit_code == 0 and "note: no ConfigMap gpupool-system/gpupool-cluster" in result.output
    assert "asks for no gpupool resource" not in result.output


def test_a_dra_claim_holds_its_card_in_inspect_and_why(cluster: list[tuple[str, str]],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim allocated from gpupool's driver (4 GiB of node a's card) is booked as the extender
    books it: inspect shows it, and why counts it (the 8 GiB pod no longer fits beside it)."""
    monkeypatch.setattr(sys.modules[__name__], "PODS", [gpu_pod("waiting", 32), placed("small", "a", 0, 1)])
    monkeypatch.setattr(sys.modules[__name__], "CLAIMS", [dra_claim("c", "a", memory="8Gi", compute="30")])
    doc = json.loads(run("inspect", "a", "-o", "json").output)
    card = doc["nodes"][0]["cards"][0]
    assert card["memoryMiB"]["booked"] == 8192 + 256
    assert [h["pod"] for h in card["holders"]] == ["team/claim:c", "team/small"]
    assert run("inspect").output.splitlines()[1].endswith("  team/claim:c (8192MiB, 30%)")
    assert json.loads(run("why", "waiting", "-o", "json").output)["groups"][0]["reason"] == \
        "no single card has 8192 MiB free"


def test_inspect_names_the_containers_that_got_their_share_through_a_claim(
        cluster: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: a claim's holder line names the containers using it, through the pod's
    resourceClaims (a template's claim through resourceClaimStatuses), among the pods it is reserved
    for; a container of the pod that does not use it is not named, and a reserved pod none of whose
    containers names it is named by itself."""
    monkeypatch.setattr(sys.modules[__name__], "NODES", [gpu_node("a", [16384, 16384])])
    monkeypatch.setattr(sys.modules[__name__], "PODS", [
        claim_pod("infer", "a", {"main": ["gpu"], "side": []}, claim="c"),
        claim_pod("tpl", "a", {"app": ["gpu"]}, template="tpl-x7k2p"),
        claim_pod("lonely", "a", {"app": []}, claim="c"),
        claim_pod("pending", "a", {"app": ["gpu"]}, claim="c")])  # names it, not reserved: not a user yet
    monkeypatch.setattr(sys.modules[__name__], "CLAIMS", [
        dra_claim("c", "a", memory="4Gi", compute="30", reserved_for=("infer", "lonely")),
        dra_claim("tpl-x7k2p", "a", card=1, reserved_for=("tpl",)),
        dra_claim("unused", "a", card=0, memory="1Gi", compute="10")])
    doc = json.loads(run("inspect", "a", "-o", "json").output)
    holders = [[(h["pod"], h["usedBy"]) for h in card["holders"]] for card in doc["nodes"][0]["cards"]]
    assert holders == [[("team/claim:c", ["team/infer/main", "team/lonely"]), ("team/claim:unused", [])],
                       [("team/claim:tpl-x7k2p", ["team/tpl/app"])]]
    lines = run("inspect").output.splitlines()
    assert lines[1].endswith("  team/claim:c (4096MiB, 30%) used by team/infer/main, team/lonely")
    assert lines[2].endswith("  team/claim:unused (1024MiB, 10%)")
    assert lines[3].endswith("  team/claim:tpl-x7k2p (whole card) used by team/tpl/app")


def test_claims_that_cannot_be_listed_are_a_note(cluster: list[tuple[str, str]],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(_: kube.Connection) -> list[dict[str, Any]]:
        raise kube.ClusterAccessError("cannot read resourceclaims.resource.k8s.io: 403 Forbidden")

    monkeypatch.setattr(kube, "list_claims", forbidden)
    result = CliRunner().invoke(cli, ["inspect"])
    assert result.exit_code == 0, result.output
    assert "note: DRA claims not read (cannot read resourceclaims.resource.k8s.io: 403 Forbidden)" in result.output


def test_claims_are_none_where_the_api_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_served(*_: Any) -> Any:
        raise kube.NotServedError("cannot read resourceclaims.resource.k8s.io: 404 Not Found")

    monkeypatch.setattr(kube, "list_custom", not_served)
    assert kube.list_claims(kube.Connection(api=None, namespace="team")) == []


def test_why_applies_the_config_maps_policy_and_lease_rule(cluster: list[tuple[str, str]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """why explains with the rules the extender reads from the same ConfigMap (docs/cluster-config.md)."""
    monkeypatch.setitem(CLUSTER_CONFIG, "policy", "binpack")
    monkeypatch.setitem(CLUSTER_CONFIG, "requireAgentLease", "true")
    doc = json.loads(run("why", "waiting", "-o", "json").output)
    assert doc["policy"] == "binpack"
    assert "1 node: node a has no gpupool node agent lease" in run("why", "waiting").output


def test_why_flags_override_the_config_maps_placement_rules(cluster: list[tuple[str, str]],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(CLUSTER_CONFIG, "policy", "binpack")
    monkeypatch.setitem(CLUSTER_CONFIG, "requireAgentLease", "true")
    doc = json.loads(run("why", "waiting", "-o", "json", "--policy", "spread").output)
    assert doc["policy"] == "spread"
    assert "no gpupool node agent lease" not in run("why", "waiting", "--no-require-agent-lease").output


@pytest.mark.parametrize(("key", "value", "words"), [
    pytest.param("policy", "tightest", "policy: unknown policy 'tightest'", id="policy"),
    pytest.param("requireAgentLease", "on", "requireAgentLease: expected true or false, got 'on'", id="boolean"),
])
def test_why_names_a_bad_placement_rule_in_the_config_map(cluster: list[tuple[str, str]],
                                                           monkeypatch: pytest.MonkeyPatch, key: str, value: str,
                                                           words: str) -> None:
    monkeypatch.setitem(CLUSTER_CONFIG, key, value)
    result = run("why", "waiting")
    assert result.exit_code == 0, result.output
    assert f"note: ConfigMap gpupool-system/gpupool-cluster: {words}" in result.output
    assert "reading pods with the built-in defaults" in result.output


def test_inspect_and_why_count_unbound_assignments_by_the_config_maps_timeout(
        cluster: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """An assignment written 400 s ago whose pod was never bound: past the default 300 s it holds
    nothing; under the cluster's unconfirmedTimeout of 600 s the extender still books the whole
    card for it, and so do inspect and why."""
    written = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=400)
    unbound = gpu_pod("unbound", 64, annotations=assignment("a", 0, 16384, when=written))
    monkeypatch.setattr(sys.modules[__name__], "PODS", [gpu_pod("waiting", 32), unbound])

    def booked() -> int:
        return int(json.loads(run("inspect", "a", "-o", "json").output)["nodes"][0]["cards"][0]["memoryMiB"]["booked"])
    assert booked() == 0
    assert json.loads(run("why", "waiting", "-o", "json").output)["fits"]
    monkeypatch.setitem(CLUSTER_CONFIG, "unconfirmedTimeout", "600")
    assert booked() == 16384
    assert json.loads(run("why", "waiting", "-o", "json").output)["groups"][0]["reason"] == \
        "no single card has 8192 MiB free"
