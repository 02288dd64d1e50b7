"""``gpupool certs bootstrap``: the extender's CA, serving and client certificates, once, into Secrets;
``gpupool certs remote-gpu-ca``: the CA that signs GPU nodes' remote GPU serving certificates.

The work is in :mod:`gpupool.extender.http.cert_secrets`; this module parses flags, writes the
client's files where kube-scheduler reads them, and says what it did.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from gpupool.extender.http.cert_secrets import CLIENT_SUFFIX, Bundle
from gpupool.extender.http.webhook_ca import (
    WebhookConfigurations,
    WebhookTarget,
    WebhookTargetError,
    inject_ca,
)

#: Files ``--client-dir`` writes, as the scheduler's extender ``tlsConfig`` names them.
CLIENT_FILES = ("client.crt", "client.key", "ca.crt")


def write_client_files(bundle: Bundle, directory: Path) -> list[Path]:
    """kube-scheduler's ``certFile``, ``keyFile`` and ``caFile``; the key readable by its owner only."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / n for n in CLIENT_FILES]
    for path, data in zip(paths, (bundle.client.cert_pem, bundle.client.key_pem, bundle.ca.cert_pem), strict=True):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        fd = os.open(path, flags, 0o600 if path.suffix == ".key" else 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    return paths


@click.group("certs")
def certs() -> None:
    """Certificates of the extender's mutual TLS (docs/security.md)."""


@certs.command("bootstrap")
@click.option("--namespace", default="kube-system", show_default=True, help="Namespace of the Secrets.")
@click.option("--secret", default="gpupool-extender-tls", show_default=True,
              help=f"The serving Secret's name; the client's is <secret>{CLIENT_SUFFIX}, the CA's <secret>-ca.")
@click.option("--service", "services", multiple=True, default=("gpupool-extender",), show_default=True,
              help="The extender's Service: the serving certificate names <service>.<namespace>.svc etc. "
                   "(repeatable: the webhooks' Service gpupool-extender-admission too).")
@click.option("--host", "hosts", multiple=True, metavar="NAME_OR_IP",
              help="Another name or address the serving certificate is valid for (repeatable).")
@click.option("--rotate", is_flag=True,
              help="Issue new serving and client certificates from the existing CA (the CA is kept).")
@click.option("--client-dir", type=click.Path(file_okay=False, path_type=Path),
              help=f"Also write the client's {', '.join(CLIENT_FILES)} here (for kube-scheduler's tlsConfig).")
@click.option("--webhook", "webhooks", multiple=True, metavar="KIND/NAME",
              help="Also write the CA into the caBundle of this webhook configuration (mutating/NAME or "
                   "validating/NAME; repeatable): what cert-manager's CA injector does where there is none.")
@click.option("--webhook-wait", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds to wait for a --webhook configuration that does not exist yet before reporting it missing.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Default: in-cluster, then ~/.kube/config.")
def bootstrap(namespace: str, secret: str, services: tuple[str, ...], hosts: tuple[str, ...], rotate: bool,
              client_dir: Path | None, webhooks: tuple[str, ...], webhook_wait: float, kubeconfig: str | None) -> None:
    """Create the extender's CA and certificates into Secrets, unless they exist (idempotent)."""
    from kubernetes import client

    from gpupool.extender.http.cert_secrets import bootstrap as run_bootstrap
    from gpupool.extender.http.certificates import service_hosts
    from gpupool.kube.client_config import api_configuration

    try:
        targets = [WebhookTarget.parse(w) for w in webhooks]
    except WebhookTargetError as exc:
        raise click.BadParameter(str(exc), param_hint="--webhook") from None
    api_client = client.ApiClient(api_configuration(kubeconfig))
    core_v1 = client.CoreV1Api(api_client)
    try:
        names = [name for service in services for name in service_hosts(service, namespace)]
        result = run_bootstrap(core_v1, namespace, secret, list(dict.fromkeys([*names, *hosts])), rotate=rotate)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if result.written:
        click.echo(f"wrote Secrets {', '.join(f'{namespace}/{n}' for n in result.written)}")
    else:
        click.echo(f"Secrets {namespace}/{secret}, {secret}{CLIENT_SUFFIX}, {secret}-ca already exist; nothing changed")
    if client_dir is not None:
        for path in write_client_files(result.bundle, client_dir):
            click.echo(f"wrote {path}")
    if targets:
        injected = inject_ca(WebhookConfigurations(client.AdmissionregistrationV1Api(api_client)),
                             result.bundle.ca.cert_pem, targets, wait_s=webhook_wait)
        for verb, done in (("wrote the CA into", injected.written), ("the CA was already in", injected.current)):
            if done:
                click.echo(f"{verb} {', '.join(map(str, done))}")
        if injected.missing:
            click.echo(f"not found after {webhook_wait:g} s, left alone: {', '.join(map(str, injected.missing))}")


@certs.command("remote-gpu-ca")
@click.option("--namespace", default="kube-system", show_default=True, help="Namespace of the Secret.")
@click.option("--secret", default="gpupool-remote-gpu-ca", show_default=True,
              help="The Secret (tls.crt, tls.key) the extender's --remote-gpu-signer names.")
@click.option("--kubeconfig", type=click.Path(dir_okay=False), help="Default: in-cluster, then ~/.kube/config.")
def remote_gpu_ca(namespace: str, secret: str, kubeconfig: str | None) -> None:
    """Create the CA of GPU nodes' remote GPU serving certificates into a Secret, unless it exists
    (idempotent; docs/remote-gpu.md, "Trust")."""
    from kubernetes import client

    from gpupool.extender.http.cert_secrets import ensure_ca
    from gpupool.kube.client_config import api_configuration

    core_v1 = client.CoreV1Api(client.ApiClient(api_configuration(kubeconfig)))
    _, made = ensure_ca(core_v1, namespace, secret, "gpupool-remote-gpu-ca")
    click.echo(f"wrote Secret {namespace}/{secret}" if made else f"Secret {namespace}/{secret} already exists; "
               "nothing changed")
