"""``gpupool simulate --tenants qos --quotas FILE``: the quota file and the per-tenant report.

The quota file maps a tenant (a QoS class of the trace) to a ``GpuQuota`` spec, read with the same
codec as the custom resource (gpupool/api/quota.py), so a quota planned here is one the cluster
would enforce::

    LS: {hard: {computePercent: 40000}}
    BE: {hard: {wholeGpus: 200}, models: {V100M16: {computePercent: 5000}}}
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import yaml

from gpupool.api.quota import decode_quota
from gpupool.api.tenancy import TenancyError
from gpupool.core.model import NodeSpec
from gpupool.core.quota import Quota
from gpupool.sim.tenants import TenantReport, replay_tenants
from gpupool.sim.trace import TracePod


def load_quotas(path: str | None) -> dict[str, list[Quota]]:
    """Quotas per tenant from a YAML file (none without a file); ``ClickException`` names a bad entry."""
    if path is None:
        return {}
    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise click.ClickException(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise click.ClickException(f"{path}: expected a mapping of tenant to GpuQuota spec")
    quotas: dict[str, list[Quota]] = {}
    for tenant, spec in doc.items():
        obj = {"metadata": {"name": "simulated", "namespace": str(tenant)}, "spec": spec}
        try:
            quotas[str(tenant)] = [decode_quota(obj)]
        except TenancyError as exc:
            raise click.ClickException(f"{path}: {exc}") from None
    return quotas


def report_tenants(nodes: list[NodeSpec], pods: list[TracePod], policies: list[str], quotas_path: str | None,
                   as_json: bool) -> None:
    quotas = load_quotas(quotas_path)
    results = {policy: replay_tenants(nodes, pods, policy, quotas) for policy in policies}
    if as_json:
        click.echo(json.dumps({"mode": "tenants", "policies": [
            {"policy": policy, "tenants": [r.to_json() for r in reports.values()]}
            for policy, reports in results.items()]}))
        return
    for policy, reports in results.items():
        click.echo(f"policy {policy}: tenants from the trace's QoS class"
                   + (f", quotas from {quotas_path}" if quotas_path else ", no quotas"))
        click.echo(f"{'tenant':<12}{'arrived':>9}{'placed':>9}{'quota':>8}{'no room':>9}{'peak GPUs':>11}"
                   f"{'mean GPUs':>11}")
        for report in reports.values():
            click.echo(_row(report))
        for report in reports.values():
            if report.first_quota_reason:
                click.echo(f"  {report.tenant}: first quota refusal: {report.first_quota_reason}")


def _row(r: TenantReport) -> str:
    return (f"{r.tenant:<12}{r.arrived:>9}{r.placed:>9}{r.refused_by_quota:>8}{r.refused_no_room:>9}"
            f"{r.peak_compute / 1000:>11.1f}{r.mean_compute / 1000:>11.1f}")
