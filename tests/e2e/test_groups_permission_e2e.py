"""Who may group what, decided by the real kube-apiserver's RBAC (v1.37.2) (seed 002's permission
filtering): a user whose ClusterRole allows ``update`` on node n1 only may group n1, not n2.

The CLI runs with the admin's kubeconfig and asks SubjectAccessReviews about the user, as a
validating webhook would about the requester of an AdmissionReview.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from kubernetes import client

from gpupool.api.annotations import Inventory, encode_inventory
from gpupool.api.names import ResourceNames
from gpupool.cli.main import cli
from gpupool.core.model import GpuCard
from gpupool.testenv.controlplane import ControlPlane
from tests.e2e.e2e_support import MakeNode

pytestmark = pytest.mark.e2e

NAMES = ResourceNames()


def gpu_node(make_node: MakeNode, model: str) -> str:
    name = f"grp-{uuid.uuid4().hex[:6]}"
    inventory = Inventory(tuple(GpuCard(i, f"GPU-{name}-{i}", model, 16_384) for i in range(2)))
    return make_node(name, annotations={NAMES.inventory: encode_inventory(inventory)})


@pytest.fixture
def user_may_update(kube_api_client: client.ApiClient) -> Iterator[Any]:
    """``grant(user, node)``: a ClusterRole allowing update on that node only, bound to the user."""
    rbac = client.RbacAuthorizationV1Api(kube_api_client)
    made: list[str] = []

    def grant(user: str, node: str) -> None:
        name = f"grp-{uuid.uuid4().hex[:6]}"
        rbac.create_cluster_role({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                  "metadata": {"name": name},
                                  "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "update"],
                                             "resourceNames": [node]}]})
        rbac.create_cluster_role_binding({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
        made.append(name)

    yield grant
    for name in made:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def group_file(tmp_path: Path, name: str, nodes: list[str]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "gpupool.io/v1alpha1", "kind": "ResourceGroup",
                                    "metadata": {"name": name}, "spec": {"nodes": [{"name": n} for n in nodes]}}))
    return path


def test_a_user_may_group_only_the_nodes_rbac_lets_them_modify(
        control_plane: ControlPlane, make_node: MakeNode, user_may_update: Any, tmp_path: Path) -> None:
    n1, n2 = gpu_node(make_node, "Tesla-T4"), gpu_node(make_node, "Tesla-T4")
    user = f"alice-{uuid.uuid4().hex[:6]}"
    user_may_update(user, n1)
    kubeconfig = str(control_plane.kubeconfig)
    runner = CliRunner()

    allowed = runner.invoke(cli, ["groups", "check", str(group_file(tmp_path, "mine", [n1])), "--as-user", user,
                                  "--kubeconfig", kubeconfig])
    assert allowed.exit_code == 0, allowed.output
    refused = runner.invoke(cli, ["groups", "check", str(group_file(tmp_path, "both", [n1, n2])), "--as-user", user,
                                  "--kubeconfig", kubeconfig])
    assert refused.exit_code == 1, refused.output
    assert f"ResourceGroup both: {user} may not modify node(s) {n2} (update or patch on nodes)" in refused.output
    assert n1 not in refused.output.split("may not modify")[1]

    proposed = runner.invoke(cli, ["groups", "propose", "--by", "model", "--as-user", user, "--kubeconfig", kubeconfig])
    assert proposed.exit_code == 0, proposed.output
    docs = [d for d in yaml.safe_load_all(proposed.stdout) if d]
    assert [n["name"] for d in docs for n in d["spec"]["nodes"]] == [n1]
    assert n2 in proposed.stderr
