"""``gpupool groups propose`` offline (``--nodes FILE``) and its input files; ``--as-user`` and
``groups check`` with a stand-in for the apiserver's SubjectAccessReview (the real one:
tests/e2e/test_groups_permission_e2e.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.api.tenancy import decode_group
from gpupool.cli import groups_cmd
from gpupool.cli.main import cli
from gpupool.core.model import GpuCard
from gpupool.kube.group_inputs import InputError, demands, groups

NAMES = ResourceNames()


def node_object(name: str, *models: str) -> dict[str, Any]:
    inventory = Inventory(tuple(GpuCard(i, f"GPU-{name}-{i}", m, 16_384) for i, m in enumerate(models)))
    resources = {"cpu": "8", "memory": "32Gi"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {NAMES.inventory: encode_inventory(inventory)}},
            "status": {"capacity": resources, "allocatable": resources}}


def nodes_file(tmp_path: Path) -> Path:
    broken = node_object("broken", "T4")
    broken["metadata"]["annotations"][NAMES.inventory] = "{not json"
    doc = {"apiVersion": "v1", "kind": "List",
           "items": [node_object("n1", "T4", "T4"), node_object("n2", "T4", "A100"), broken]}
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, ["groups", *args])


def test_propose_by_model_offline_writes_manifests_the_codec_reads(tmp_path: Path) -> None:
    result = invoke("propose", "--by", "model", "--nodes", str(nodes_file(tmp_path)))
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert {decode_group(d).name for d in docs} == {"model-a100", "model-t4"}
    t4 = next(d for d in docs if d["metadata"]["name"] == "model-t4")
    assert t4["spec"]["nodes"] == [{"name": "n1"}, {"name": "n2", "gpus": ["GPU-n2-0"]}]
    assert "left out: node broken" in result.stderr


def test_propose_by_demand_into_a_directory(tmp_path: Path) -> None:
    demand = tmp_path / "demand.yaml"
    demand.write_text("team-a: 2\nteam-b: {gpus: 1, model: A100, namespaces: [b1]}\n")
    out = tmp_path / "out"
    result = invoke("propose", "--demand", str(demand), "--nodes", str(nodes_file(tmp_path)), "--output-dir", str(out))
    assert result.exit_code == 0, result.output
    team_a = yaml.safe_load((out / "team-a.yaml").read_text())
    assert team_a["spec"] == {"shared": False, "nodes": [{"name": "n1"}],
                              "subjects": [{"kind": "Namespace", "name": "team-a"}]}
    assert decode_group(yaml.safe_load((out / "team-b.yaml").read_text())).subjects[0].name == "b1"


def test_propose_refusal_is_a_clear_error(tmp_path: Path) -> None:
    demand = tmp_path / "demand.yaml"
    demand.write_text("team-a: 9\n")
    result = invoke("propose", "--demand", str(demand), "--nodes", str(nodes_file(tmp_path)))
    assert result.exit_code == 1 and "team team-a expects 9 GPUs; only 4 left" in result.output


def test_as_user_leaves_out_nodes_the_user_may_not_modify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groups_cmd, "_api_client", lambda _: None)
    monkeypatch.setattr(groups_cmd, "_checker", lambda _api, user, _groups: lambda node: node == "n1")
    result = invoke("propose", "--by", "model", "--nodes", str(nodes_file(tmp_path)), "--as-user", "alice")
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [(d["metadata"]["name"], d["spec"]["nodes"]) for d in docs] == [("model-t4", [{"name": "n1"}])]
    assert "left out, alice may not modify them: n2" in result.stderr


def test_check_refuses_a_group_naming_a_forbidden_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groups_cmd, "_api_client", lambda _: None)
    monkeypatch.setattr(groups_cmd, "_checker", lambda _api, user, _groups: lambda node: node == "n1")
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump_all([
        {"apiVersion": "gpupool.io/v1alpha1", "kind": "ResourceGroup", "metadata": {"name": "ok"},
         "spec": {"nodes": [{"name": "n1"}]}},
        {"apiVersion": "gpupool.io/v1alpha1", "kind": "ResourceGroup", "metadata": {"name": "bad"},
         "spec": {"nodes": [{"name": "n1"}, {"name": "n2"}]}}]))
    result = invoke("check", str(path), "--as-user", "alice")
    assert result.exit_code == 1
    assert "ResourceGroup ok: alice may group its 1 node(s)" in result.output
    assert "ResourceGroup bad: alice may not modify node(s) n2" in result.output


@pytest.mark.parametrize(("data", "message"), [
    pytest.param([1], "expected a mapping", id="not-a-mapping"),
    pytest.param({"t": 0}, "gpus must be a whole number", id="zero"),
    pytest.param({"t": True}, "gpus must be a whole number", id="bool"),
    pytest.param({"t": {"gpus": 1, "colour": "red"}}, "unknown field", id="unknown-field"),
    pytest.param({"t": {"gpus": 1, "namespaces": "a"}}, "namespaces must be a list", id="namespaces-not-list"),
    pytest.param({"t\x00": 1}, "team", id="control-character"),
])
def test_bad_demand_files_name_the_entry(data: Any, message: str) -> None:
    with pytest.raises(InputError, match=message):
        demands(data)


def test_manifest_files_are_decoded_by_the_extenders_codec() -> None:
    with pytest.raises(InputError, match=r"spec\.nodes\[1\]\.name: node n is listed twice"):
        groups([{"kind": "ResourceGroup", "metadata": {"name": "g"},
                 "spec": {"nodes": [{"name": "n"}, {"name": "n"}]}}])
    with pytest.raises(InputError, match="no ResourceGroup"):
        groups([{"kind": "Node"}])
