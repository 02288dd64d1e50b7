"""``gpupool groups propose`` and ``gpupool groups check``: ResourceGroups proposed from the cluster's
GPU inventory for an admin to edit and apply, and a check of who may apply them (docs/tenancy.md,
"Proposing groups" and "Who may group what").

The work is in :mod:`gpupool.kube.group_proposal` (grouping), :mod:`gpupool.kube.group_permission`
(SubjectAccessReview) and :mod:`gpupool.kube.group_inputs` (reading files and nodes); this module
parses flags, reads the cluster and writes YAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import yaml

from gpupool.api.names import ResourceNames
from gpupool.kube.group_inputs import InputError, demands, groups, node_specs, objects
from gpupool.kube.group_permission import MayModify, Requester, permitted_nodes, refusal, sar_may_modify
from gpupool.kube.group_proposal import ProposalError, ProposalRequest, manifest, propose

HEADER = ("# Proposed by `gpupool groups propose`: edit, then `kubectl apply -f` this file.\n"
          "# shared: true only narrows the pods naming the group; false reserves its GPUs for them.\n")


def _api_client(kubeconfig: str | None) -> Any:
    from kubernetes import client

    from gpupool.kube.client_config import api_configuration

    return client.ApiClient(api_configuration(kubeconfig))


def _cluster_nodes(api_client: Any) -> list[Mapping[str, Any]]:
    from kubernetes import client

    items = client.CoreV1Api(api_client).list_node().items
    return [api_client.sanitize_for_serialization(item) for item in items]


def _yaml_documents(path: Path) -> list[Any]:
    try:
        return list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as exc:
        raise click.ClickException(f"{path}: {exc}") from None


def _checker(api_client: Any, user: str, user_groups: tuple[str, ...]) -> MayModify:
    from kubernetes import client

    return sar_may_modify(client.AuthorizationV1Api(api_client), Requester(user, user_groups))


@click.group("groups")
def groups_cli() -> None:
    """ResourceGroups: propose them from the GPU inventory, check who may apply them."""


@groups_cli.command("propose")
@click.option("--by", "by", type=click.Choice(["model"]), help="One group per GPU model.")
@click.option("--split", default=1, show_default=True, type=int,
              help="With --by model: cut each model's GPUs into this many groups of similar size.")
@click.option("--demand", "demand_file", type=click.Path(dir_okay=False, path_type=Path),
              help="YAML team -> expected GPUs (or {gpus, model, namespaces}): one group per team, best fit.")
@click.option("--nodes", "nodes_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Read Nodes from this file (kubectl get nodes -o yaml) instead of the cluster.")
@click.option("--as-user", "user", help="Group only the nodes this user may modify (SubjectAccessReview).")
@click.option("--as-group", "user_groups", multiple=True, help="A group of --as-user (repeatable).")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write one <group>.yaml per group here instead of stdout.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Default: in-cluster, then ~/.kube/config.")
def propose_cmd(by: str | None, split: int, demand_file: Path | None, nodes_file: Path | None, user: str | None,
                user_groups: tuple[str, ...], output_dir: Path | None, kubeconfig: str | None) -> None:
    """Propose ResourceGroups from the nodes' GPUs, by model and/or expected demand."""
    api_client = None
    if nodes_file is not None:
        raw_nodes = objects(_yaml_documents(nodes_file), "Node")
    else:
        api_client = _api_client(kubeconfig)
        raw_nodes = _cluster_nodes(api_client)
    specs, problems = node_specs(raw_nodes, ResourceNames())
    for problem in problems:
        click.echo(problem, err=True)
    if user:
        allowed, refused = permitted_nodes([s.name for s in specs],
                                           _checker(api_client or _api_client(kubeconfig), user, user_groups))
        if refused:
            click.echo(f"left out, {user} may not modify them: {', '.join(refused)}", err=True)
        specs = [s for s in specs if s.name in set(allowed)]
    try:
        wanted = demands(yaml.safe_load(demand_file.read_text())) if demand_file else ()
        proposal = propose(specs, ProposalRequest(by_model=by == "model", split=split, demands=wanted))
    except (InputError, ProposalError, OSError, yaml.YAMLError) as exc:
        raise click.ClickException(str(exc)) from None
    texts = {g.name: yaml.safe_dump(manifest(g), sort_keys=False) for g in proposal}
    if output_dir is None:
        click.echo(HEADER + "---\n".join(texts.values()), nl=False)
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (output_dir / f"{name}.yaml").write_text(HEADER + text)
        click.echo(f"wrote {output_dir / f'{name}.yaml'}")


@groups_cli.command("check")
@click.argument("manifests", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--as-user", "user", required=True, help="The user who would apply the groups.")
@click.option("--as-group", "user_groups", multiple=True, help="A group of --as-user (repeatable).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Default: in-cluster, then ~/.kube/config.")
def check_cmd(manifests: Path, user: str, user_groups: tuple[str, ...], kubeconfig: str | None) -> None:
    """Check that --as-user may modify every node the file's ResourceGroups name; exit 1 if not."""
    try:
        found = groups(_yaml_documents(manifests))
    except InputError as exc:
        raise click.ClickException(f"{manifests}: {exc}") from None
    may_modify = _checker(_api_client(kubeconfig), user, user_groups)
    reasons = [r for r in (refusal(g, user, may_modify) for g in found) if r is not None]
    for group in found:
        if not any(r.startswith(f"ResourceGroup {group.name}:") for r in reasons):
            click.echo(f"ResourceGroup {group.name}: {user} may group its {len(group.nodes)} node(s)")
    if reasons:
        raise click.ClickException("\n".join(reasons))
