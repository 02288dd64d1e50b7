"""The GPU node's side of remote shares: the clients file of its GPU server, one token per pod, the
Secret that hands the token over, and the server process kept running
(gpupool/nodeagent/remote_server.py, remote_serving.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from gpupool.api.annotations import CardRef
from gpupool.api.names import ResourceNames
from gpupool.api.remote_share import RemoteShare, encode_remote_share
from gpupool.nodeagent.remote_server import CA_KEY, RemoteClients, ServedShare, served_shares, token_secret
from gpupool.nodeagent.remote_serving import ServerProcess, TokenSecrets, server_command

NAMES = ResourceNames()
WHEN = dt.datetime(2026, 11, 28, 17, 0, tzinfo=dt.UTC)


def remote_pod(name: str, *, server: str = "gpu", node: str = "cpu", uid: str | None = None,
               decided_for: str | None = None, phase: str = "Running", compute: int = 305) -> dict[str, Any]:
    uid = uid or f"uid-{name}"
    share = RemoteShare(server=server, time=WHEN, container="main", pod_uid=decided_for or uid,
                        card=CardRef(0, f"GPU-{server}-0", 4000, compute))
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid,
                         "annotations": {NAMES.remote_share: encode_remote_share(share)}},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_only_live_bound_pods_whose_share_names_this_node_are_served() -> None:
    pods = [remote_pod("a"), remote_pod("elsewhere", server="other"), remote_pod("done", phase="Succeeded"),
            remote_pod("unbound", node=""), remote_pod("replaced", decided_for="uid-of-predecessor"),
            {"metadata": {"name": "plain", "namespace": "ns", "uid": "u"}, "spec": {"nodeName": "gpu"}}]
    assert served_shares(pods, "gpu", NAMES) == [
        ServedShare(pod="ns/a", pod_uid="uid-a", card_uuid="GPU-gpu-0", memory_mib=4000, compute_percent=30)]


def test_the_clients_file_lists_each_pod_with_its_own_token_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "clients.json"
    clients = RemoteClients("gpu", NAMES, path)
    assert clients.replace([remote_pod("a"), remote_pod("b")])
    doc = json.loads(path.read_text())
    assert doc["version"] == 1
    assert [(c["pod"], c["card_uuid"], c["memory_mib"], c["compute_percent"]) for c in doc["clients"]] == [
        ("ns/a", "GPU-gpu-0", 4000, 30), ("ns/b", "GPU-gpu-0", 4000, 30)]
    tokens = [c["token"] for c in doc["clients"]]
    assert len(set(tokens)) == 2 and all(len(t) >= 32 for t in tokens)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not clients.event("MODIFIED", remote_pod("a"))  # same contents: not rewritten


def test_the_clients_file_is_written_into_a_state_directory_that_does_not_exist_yet(tmp_path: Path) -> None:
    """A fresh --state-dir: the agent's first write used to fail (FileNotFoundError) and stop the agent."""
    path = tmp_path / "state" / "remote" / "clients.json"
    clients = RemoteClients("gpu", NAMES, path)
    assert clients.apply()
    assert json.loads(path.read_text())["clients"] == []
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert clients.replace([remote_pod("a")])
    assert [c["pod"] for c in json.loads(path.read_text())["clients"]] == ["ns/a"]


def test_a_pod_that_ends_leaves_the_file_and_its_successor_gets_a_new_token(tmp_path: Path) -> None:
    path = tmp_path / "clients.json"
    clients = RemoteClients("gpu", NAMES, path)
    clients.replace([remote_pod("a")])
    first = json.loads(path.read_text())["clients"][0]["token"]
    assert clients.event("DELETED", remote_pod("a"))
    assert json.loads(path.read_text())["clients"] == []
    clients.event("ADDED", remote_pod("a", uid="uid-a-again"))
    assert json.loads(path.read_text())["clients"][0]["token"] != first


def test_a_restarted_agent_keeps_the_tokens_of_the_file_it_finds(tmp_path: Path) -> None:
    path = tmp_path / "clients.json"
    RemoteClients("gpu", NAMES, path).replace([remote_pod("a")])
    before = path.read_text()
    again = RemoteClients("gpu", NAMES, path)
    assert not again.replace([remote_pod("a")])
    assert path.read_text() == before


def test_the_token_secret_is_owned_by_the_pod() -> None:
    share = ServedShare(pod="ns/a", pod_uid="uid-a", card_uuid="GPU-0", memory_mib=1, compute_percent=0)
    secret = token_secret(share, "t" * 43, "10.0.0.7:9420")
    assert secret["metadata"]["name"] == "a-gpupool-remote" and secret["metadata"]["namespace"] == "ns"
    assert secret["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "a", "uid": "uid-a"}]
    assert secret["stringData"] == {"remote_endpoint": "10.0.0.7:9420", "remote_token": "t" * 43}


def test_secrets_are_written_once_per_token_and_retried_after_a_failure(tmp_path: Path) -> None:
    clients = RemoteClients("gpu", NAMES, tmp_path / "clients.json")
    clients.replace([remote_pod("a"), remote_pod("b")])
    written: list[str] = []
    refuse = {"b-gpupool-remote"}

    def write(manifest: dict[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        if name in refuse:
            raise RuntimeError("apiserver said no")
        written.append(name)

    secrets = TokenSecrets(clients, write, "10.0.0.7:9420")
    assert secrets.publish() == 1 and written == ["a-gpupool-remote"]
    refuse.clear()
    assert secrets.publish() == 0 and written == ["a-gpupool-remote", "b-gpupool-remote"]
    assert secrets.publish() == 0 and len(written) == 2


@pytest.mark.slow  # imports the CLI / the kubernetes client, or waits for restarts
def test_the_server_is_started_with_the_data_planes_command_and_again_after_it_exits(tmp_path: Path) -> None:
    assert server_command("0.0.0.0:9420", Path("/run/gpupool/clients.json")) == [
        "gpupool", "remote-gpu", "serve", "--listen", "0.0.0.0:9420", "--clients", "/run/gpupool/clients.json"]
    marks = tmp_path / "starts"
    fake = [sys.executable, "-c", f"open({str(marks)!r}, 'a').write('x')"]  # a server that exits at once

    async def scenario() -> int:
        server = ServerProcess(fake, restart_s=0.01)
        task = asyncio.create_task(server.run())
        for _ in range(500):
            await asyncio.sleep(0.01)
            if marks.exists() and len(marks.read_text()) >= 2:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return server.starts

    assert asyncio.run(scenario()) >= 2


def test_a_running_server_is_terminated_when_the_agent_stops(tmp_path: Path) -> None:
    async def scenario() -> int | None:
        server = ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"])
        task = asyncio.create_task(server.run())
        while server.process is None:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return server.process.returncode

    assert asyncio.run(scenario()) is not None


def agent_remote(monkeypatch: pytest.MonkeyPatch, *flags: str) -> tuple[int, str, Any]:
    """The exit code, output and ``remote`` options ``gpupool node-agent FLAGS`` would run with."""
    from click.testing import CliRunner

    from gpupool.api.cluster_settings import ClusterSettings
    from gpupool.cli import cluster_options, node_agent_cmd
    from gpupool.cli.main import cli
    from gpupool.nodeagent.options import AgentOptions

    seen: dict[str, Any] = {}

    async def fake_run(options: AgentOptions) -> None:
        seen["remote"] = options.remote

    monkeypatch.setattr(node_agent_cmd, "run_agent", fake_run)
    monkeypatch.setattr(cluster_options, "read_with_client", lambda _k: lambda _w: ClusterSettings())
    result = CliRunner().invoke(cli, ["node-agent", "--no-usage-monitor", "--state-dir", "/run/gp", *flags])
    return result.exit_code, result.output, seen.get("remote")


@pytest.mark.slow  # imports the CLI / the kubernetes client, or waits for restarts
def test_the_server_is_off_unless_asked_and_its_flags_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.nodeagent.remote_setup import RemoteGpuOptions

    assert agent_remote(monkeypatch)[::2] == (0, None)
    code, _, remote = agent_remote(monkeypatch, "--remote-gpu-server", "127.0.0.1:9420",
                                   "--remote-gpu-endpoint", "10.0.0.7:9420")
    assert (code, remote) == (0, RemoteGpuOptions("127.0.0.1:9420", "10.0.0.7:9420",
                                                  Path("/run/gp/remote-gpu-clients.json")))
    code, output, _ = agent_remote(monkeypatch, "--remote-gpu-server", "0.0.0.0:9420")
    assert code == 2 and "not a loopback address; give --remote-gpu-tls-cert and --remote-gpu-tls-key" in output
    assert "or --remote-gpu-allow-plain to serve plain TCP" in " ".join(output.split()), output
    assert "--listen" not in output  # the agent's flag names, not those of `gpupool remote-gpu serve`
    code, _, remote = agent_remote(monkeypatch, "--remote-gpu-server", "0.0.0.0:9420", "--remote-gpu-allow-plain")
    assert code == 0 and remote.allow_plain and remote.command()[-1] == "--allow-plain"
    code, output, _ = agent_remote(monkeypatch, "--remote-gpu-server", "9420")
    assert code == 2 and "--remote-gpu-server: expected HOST:PORT" in output
    code, output, _ = agent_remote(monkeypatch, "--remote-gpu-endpoint", "10.0.0.7:9420")
    assert code == 2 and "needs --remote-gpu-server" in output


@pytest.mark.slow  # imports the CLI / the kubernetes client, or waits for restarts
def test_the_agents_cublas_reaches_the_servers_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """--remote-gpu-cublas PATH becomes `gpupool remote-gpu serve --cublas PATH` (a flag serve
    declares), with the node's own certificate too; without it serve gets none and looks for one
    itself; it needs --remote-gpu-server."""
    from gpupool.cli.remote_gpu_cmd import serve_cmd

    library = "/opt/nvidia-cublas/libcublas.so.12"
    code, output, remote = agent_remote(monkeypatch, "--remote-gpu-server", "127.0.0.1:9420",
                                        "--remote-gpu-cublas", library)
    assert code == 0, output
    command = remote.command()
    assert command[-2:] == ["--cublas", library]
    assert serve_cmd.make_context("serve", command[3:]).params["cublas"] == library
    _, _, remote = agent_remote(monkeypatch, "--remote-gpu-server", "127.0.0.1:9420")
    assert "--cublas" not in remote.command()
    assert serve_cmd.make_context("serve", remote.command()[3:]).params["cublas"] is None
    _, _, remote = agent_remote(monkeypatch, "--remote-gpu-server", "127.0.0.1:9420", "--remote-gpu-endpoint",
                                "10.0.0.7:9420", "--remote-gpu-tls-from-cluster", "--remote-gpu-cublas", library)
    assert remote.own_certificate == ("10.0.0.7",) and remote.command()[-2:] == ["--cublas", library]
    code, output, _ = agent_remote(monkeypatch, "--remote-gpu-cublas", library)
    assert code == 2 and "needs --remote-gpu-server" in output and "--remote-gpu-cublas" in output


@pytest.mark.slow  # imports the CLI / the kubernetes client, or waits for restarts
def test_an_existing_secret_is_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.client import exceptions

    from gpupool.nodeagent.remote_setup import write_secret

    calls: list[str] = []

    class CoreV1:
        def create_namespaced_secret(self, namespace: str, body: dict[str, Any]) -> None:
            calls.append(f"create {namespace}")
            raise exceptions.ApiException(status=409)

        def patch_namespaced_secret(self, name: str, namespace: str, body: dict[str, Any]) -> None:
            calls.append(f"patch {namespace}/{name}")

    write_secret(CoreV1(), {"metadata": {"name": "a-gpupool-remote", "namespace": "ns"}})
    assert calls == ["create ns", "patch ns/a-gpupool-remote"]


@pytest.mark.slow  # imports the CLI / the kubernetes client
def test_the_agent_passes_tls_and_compute_enforcement_to_its_server(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    """Off loopback the server refuses plain TCP: the agent must hand it its certificate, and clients
    the CA to check it with (in their Secret), or it could serve no remote client there."""
    cert, key, ca = (tmp_path / name for name in ("server.crt", "server.key", "ca.crt"))
    cert.write_text("chain"), key.write_text("key")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    code, output, remote = agent_remote(monkeypatch, "--remote-gpu-server", "0.0.0.0:9420", "--remote-gpu-tls-cert",
                                        str(cert), "--remote-gpu-tls-key", str(key), "--remote-gpu-tls-ca", str(ca),
                                        "--remote-gpu-enforce-compute")
    assert code == 0, output
    assert remote.command() == ["gpupool", "remote-gpu", "serve", "--listen", "0.0.0.0:9420", "--clients",
                                "/run/gp/remote-gpu-clients.json", "--tls-cert", str(cert), "--tls-key", str(key),
                                "--enforce-compute"]
    assert remote.client_ca == ca.read_text()
    share = ServedShare("team-a/train-0", "uid-1", "GPU-0", 4096, 50)
    assert token_secret(share, "t", "10.0.0.7:9420", remote.client_ca)["stringData"] == {
        "remote_endpoint": "10.0.0.7:9420", "remote_token": "t", CA_KEY: ca.read_text()}
    assert CA_KEY not in token_secret(share, "t", "10.0.0.7:9420")["stringData"]


@pytest.mark.slow  # imports the CLI / the kubernetes client
@pytest.mark.parametrize(("flags", "message"), [
    pytest.param(["--remote-gpu-tls-cert", "{cert}"], "--remote-gpu-tls-cert and --remote-gpu-tls-key go together",
                 id="cert-alone"),
    pytest.param(["--remote-gpu-tls-ca", "{ca}"], "give --remote-gpu-tls-cert and --remote-gpu-tls-key too",
                 id="ca-without-tls"),
    pytest.param(["--remote-gpu-tls-cert", "{cert}", "--remote-gpu-tls-key", "{cert}", "--remote-gpu-tls-ca", "{cert}"],
                 "holds no PEM certificate", id="ca-not-pem"),
    pytest.param(["--remote-gpu-tls-cert", "{tmp}/missing"], "does not exist", id="missing-file"),
])
def test_bad_server_flags_stop_the_agent_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         flags: list[str], message: str) -> None:
    cert, ca = tmp_path / "server.crt", tmp_path / "ca.crt"
    cert.write_text("chain")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    given = [flag.format(cert=cert, ca=ca, tmp=tmp_path) for flag in flags]
    code, output, _ = agent_remote(monkeypatch, "--remote-gpu-server", "0.0.0.0:9420", *given)
    assert code == 2 and message in output
    code, output, _ = agent_remote(monkeypatch, "--remote-gpu-enforce-compute")
    assert code == 2 and "needs --remote-gpu-server" in output and "--remote-gpu-enforce-compute" in output


def test_the_publish_loop_stops_when_cancelled_as_a_change_arrives() -> None:
    """Cancelled in the same turn of the event loop as a change is signalled, the loop must end:
    with ``asyncio.wait_for`` (Python 3.11) the cancellation was dropped and the agent's stop hung."""
    from gpupool.nodeagent.remote_setup import publish_on_change

    async def main() -> tuple[bool, int]:
        changed = asyncio.Event()
        published: list[int] = []
        task = asyncio.create_task(publish_on_change(changed, 60.0, lambda: published.append(1)))
        for _ in range(3):
            await asyncio.sleep(0)
        asyncio.get_running_loop().call_soon(lambda: (changed.set(), task.cancel()))
        await asyncio.wait({task}, timeout=2)
        return task.cancelled(), len(published)

    assert asyncio.run(main()) == (True, 0)


def two_card_pod(name: str) -> dict[str, Any]:
    share = RemoteShare(server="gpu", time=WHEN, container="main", pod_uid=f"uid-{name}",
                        card=CardRef(1, "GPU-gpu-1", 4000, 300), more_cards=(CardRef(3, "GPU-gpu-3", 4000, 300),))
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {NAMES.remote_share: encode_remote_share(share)}},
            "spec": {"nodeName": "cpu"}, "status": {"phase": "Running"}}


def test_a_two_card_pod_is_one_client_with_both_cards_in_device_order_and_one_token(tmp_path: Path) -> None:
    path = tmp_path / "clients.json"
    clients = RemoteClients("gpu", NAMES, path)
    assert clients.replace([two_card_pod("pair"), remote_pod("one")])
    doc = json.loads(path.read_text())
    by_pod = {c["pod"]: c for c in doc["clients"]}
    assert by_pod["ns/pair"]["card_uuids"] == ["GPU-gpu-1", "GPU-gpu-3"] and "card_uuid" not in by_pod["ns/pair"]
    assert (by_pod["ns/pair"]["memory_mib"], by_pod["ns/pair"]["compute_percent"]) == (4000, 30)
    assert by_pod["ns/one"]["card_uuid"] == "GPU-gpu-0" and "card_uuids" not in by_pod["ns/one"]
    assert len({c["token"] for c in doc["clients"]}) == 2
    restarted = RemoteClients("gpu", NAMES, path)  # an agent restart keeps the two-card pod's token
    restarted.replace([two_card_pod("pair"), remote_pod("one")])
    assert json.loads(path.read_text()) == doc


def test_cards_booked_differently_are_served_the_smallest_booking_on_each() -> None:
    """A compute share with proportional memory on a 16 GiB and an 8 GiB card books 4,000 and 2,000
    MiB: the server holds the client to 2,000 MiB on both, never more than a card holds for it."""
    share = RemoteShare(server="gpu", time=WHEN, container="main", pod_uid="uid-p",
                        card=CardRef(0, "GPU-gpu-0", 4000, 250), more_cards=(CardRef(1, "GPU-gpu-1", 2000, 250),))
    raw = {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p",
                        "annotations": {NAMES.remote_share: encode_remote_share(share)}},
           "spec": {"nodeName": "cpu"}, "status": {"phase": "Running"}}
    assert served_shares([raw], "gpu", NAMES) == [
        ServedShare(pod="ns/p", pod_uid="uid-p", card_uuid="GPU-gpu-0", memory_mib=2000, compute_percent=25,
                    more_card_uuids=("GPU-gpu-1",))]
