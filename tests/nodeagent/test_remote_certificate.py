"""The node agent's own remote GPU serving certificate: key made on the node, asked of the signer, renewed."""

from __future__ import annotations

import asyncio
import datetime as dt
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from gpupool.extender.http.certificates import issue_ca
from gpupool.extender.remote_gpu_signer import LIFETIME, RequestSigner
from gpupool.nodeagent.remote_certificate import (
    CertificateDenied,
    CertificateRefused,
    ServerCertificate,
    load_or_make_key,
    request_manifest,
)
from tests.extender.csr_fakes import FakeCsrApi, node_json

NODES = {"node-a": node_json("node-a", "10.0.0.1", "192.168.1.7")}


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime.now(dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture(scope="module")
def ca() -> Any:
    return issue_ca("gpupool-remote-gpu-ca")


def signing_api(ca: Any, node: str = "node-a") -> FakeCsrApi:
    """The stand-in apiserver with the extender's signer answering each request as it is created."""
    api = FakeCsrApi(node=node)
    signer = RequestSigner(api, ca, NODES.get)
    api.on_create = lambda request: signer.answer(request)
    return api


def public(key: Any) -> bytes:
    return bytes(key.public_key().public_bytes(serialization.Encoding.DER,
                                               serialization.PublicFormat.SubjectPublicKeyInfo))


def test_the_key_is_made_on_the_node_once_and_kept_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "remote-gpu-tls.key"
    first = load_or_make_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public(load_or_make_key(path)) == public(first)  # an agent restart keeps it


def test_the_certificate_is_issued_for_the_nodes_key_and_written_beside_it(ca: Any, tmp_path: Path) -> None:
    api = signing_api(ca)
    keeper = ServerCertificate(api, "node-a", ["10.0.0.1"], tmp_path)
    assert keeper.due() == "no certificate yet"
    cert = keeper.obtain(wait_s=1, poll_s=0)
    cert.verify_directly_issued_by(ca.certificate)
    assert public(cert) == public(load_or_make_key(keeper.key_path))
    assert keeper.current() == cert
    assert keeper.due() == ""
    # what the request carried: the public key and names, never the private key
    sent = next(iter(api.items.values()))["spec"]["request"]
    assert b"PRIVATE" not in sent.encode() and keeper.key_path.read_bytes() not in sent.encode()


def test_it_is_due_again_after_two_thirds_of_its_life(ca: Any, tmp_path: Path) -> None:
    clock = Clock()
    keeper = ServerCertificate(signing_api(ca), "node-a", ["10.0.0.1"], tmp_path, now=clock)
    keeper.obtain(wait_s=1, poll_s=0)
    clock.now += LIFETIME * 0.6
    assert keeper.due() == ""
    clock.now += LIFETIME * 0.1
    assert keeper.due().startswith("two thirds of its life are gone")
    renew_at = keeper.renew_at()
    assert renew_at is not None and clock.now > renew_at
    old = keeper.current()
    renewed = keeper.obtain(wait_s=1, poll_s=0)  # a new request (a new name), not the first one's answer
    assert old is not None and renewed.serial_number != old.serial_number
    assert len(keeper.api.items) == 2


def test_new_addresses_or_a_new_key_make_it_due(ca: Any, tmp_path: Path) -> None:
    api = signing_api(ca)
    ServerCertificate(api, "node-a", ["10.0.0.1"], tmp_path).obtain(wait_s=1, poll_s=0)
    moved = ServerCertificate(api, "node-a", ["10.0.0.1", "192.168.1.7"], tmp_path)
    assert moved.due().startswith("it names ['10.0.0.1']")
    moved.obtain(wait_s=1, poll_s=0)
    assert moved.due() == ""
    moved.key_path.unlink()  # a lost key: a new one is made, the old certificate no longer fits
    assert moved.due() == "it is not for this node's key"


def test_a_denied_request_raises_with_the_signers_reason(ca: Any, tmp_path: Path) -> None:
    keeper = ServerCertificate(signing_api(ca), "node-a", ["10.9.9.9"], tmp_path)
    with pytest.raises(CertificateDenied, match=r"Denied: 10\.9\.9\.9 is not among node node-a's addresses"):
        keeper.obtain(wait_s=1, poll_s=0)
    assert keeper.current() is None


def fixable_signer(ca: Any) -> tuple[FakeCsrApi, dict[str, dict[str, Any]]]:
    """The stand-in apiserver and signer, whose Node node-a lacks 10.0.0.1 (so the agent's request
    for it is denied) until the test puts it in the returned nodes (the cause fixed)."""
    nodes = {"node-a": node_json("node-a", "192.168.1.7")}
    api = FakeCsrApi()
    signer = RequestSigner(api, ca, nodes.get)

    def answer(request: dict[str, Any]) -> None:
        signer.answer(request)

    api.on_create = answer
    return api, nodes


def conditions(api: FakeCsrApi) -> list[str]:
    """Each request's answer, in the order they were made."""
    return [next((c["type"] for c in (d.get("status") or {}).get("conditions", ())), "pending")
            for d in api.items.values()]


def test_after_a_denial_the_agent_asks_with_a_new_request_that_the_fixed_signer_approves(
        ca: Any, tmp_path: Path) -> None:
    """A denied request keeps its answer: asked again under its name, the agent would read the same
    denial for an hour (until kube-controller-manager removes it), whatever was fixed meanwhile."""
    from gpupool.nodeagent.remote_setup import obtain_certificate

    api, nodes = fixable_signer(ca)
    answer = api.on_create
    assert answer is not None

    def then_fix(request: dict[str, Any]) -> None:
        answer(request)
        nodes["node-a"] = NODES["node-a"]  # the Node's address is fixed after the first denial

    api.on_create = then_fix
    keeper = ServerCertificate(api, "node-a", ["10.0.0.1"], tmp_path)

    async def scenario() -> None:
        async with asyncio.timeout(10):
            await obtain_certificate(keeper, retry_s=0)

    asyncio.run(scenario())
    assert keeper.due() == ""
    assert conditions(api) == ["Denied", "Approved"]  # two requests: the second a new one
    assert api.calls.count("create") == 2


def test_a_restarted_agent_steps_past_its_refused_requests_and_makes_one_new_request_per_ask(
        ca: Any, tmp_path: Path) -> None:
    api, nodes = fixable_signer(ca)
    keeper = ServerCertificate(api, "node-a", ["10.0.0.1"], tmp_path)
    for _ in range(2):
        with pytest.raises(CertificateDenied):
            keeper.obtain(wait_s=1, poll_s=0)
    assert conditions(api) == ["Denied", "Denied"] and keeper.attempt == 2
    nodes["node-a"] = NODES["node-a"]
    restarted = ServerCertificate(api, "node-a", ["10.0.0.1"], tmp_path)  # counts from 0 again
    restarted.obtain(wait_s=1, poll_s=0)
    assert conditions(api) == ["Denied", "Denied", "Approved"] and restarted.attempt == 2
    assert restarted.due() == ""
    assert api.calls.count("create") == 2 + 3  # the restarted agent: two 409s, then its new request


def test_only_a_refusal_changes_the_requests_name(tmp_path: Path) -> None:
    from gpupool.api.remote_gpu_certs import node_request_pem

    key = load_or_make_key(tmp_path / "k")
    first, again = (node_request_pem(key, "node-a", ["10.0.0.1"]) for _ in range(2))
    assert first != again  # ECDSA signs anew: the name must not depend on the signature
    names = [request_manifest("node-a", pem, attempt=n)["metadata"]["name"] for pem, n in
             ((first, 0), (again, 0), (first, 1), (first, 2))]
    assert names[0] == names[1] and len(set(names)) == 3
    assert all(n.startswith("gpupool-remote-gpu-node-a-") for n in names)


def test_the_pause_after_denials_widens_to_five_minutes() -> None:
    from gpupool.nodeagent.remote_setup import retry_after

    assert [retry_after(n) for n in range(1, 8)] == [30, 60, 120, 240, 300, 300, 300]
    assert retry_after(10_000) == 300 and retry_after(3, retry_s=0) == 0


def test_no_answer_in_time_raises_and_the_same_request_is_waited_for_again(ca: Any, tmp_path: Path) -> None:
    api = FakeCsrApi()  # no signer running
    sleeps: list[float] = []
    keeper = ServerCertificate(api, "node-a", ["10.0.0.1"], tmp_path, sleep=sleeps.append)
    with pytest.raises(CertificateRefused, match="no answer from the signer"):
        keeper.obtain(wait_s=0, poll_s=0.5)
    signer = RequestSigner(api, ca, NODES.get)
    api.on_create = lambda request: signer.answer(request)  # not called: the request exists (409)
    (pending,) = api.items.values()
    signer.answer(dict(pending))
    keeper.obtain(wait_s=1, poll_s=0)
    assert api.calls.count("create") == 2 and len(api.items) == 1
    assert keeper.due() == ""


def test_the_agent_asks_again_until_the_certificate_is_issued(ca: Any, tmp_path: Path) -> None:
    from gpupool.nodeagent.remote_setup import obtain_certificate

    api = signing_api(ca)
    failures = [RuntimeError("apiserver unreachable")]
    create = api.create_certificate_signing_request

    def flaky(body: dict[str, Any]) -> Any:
        if failures:
            raise failures.pop()
        return create(body)

    api.create_certificate_signing_request = flaky  # type: ignore[method-assign]
    keeper = ServerCertificate(api, "node-a", ["10.0.0.1"], tmp_path)
    asyncio.run(obtain_certificate(keeper, retry_s=0))
    assert keeper.due() == "" and not failures


def test_a_renewed_certificate_is_reloaded_by_the_server_not_restarted(ca: Any, tmp_path: Path) -> None:
    from gpupool.nodeagent.remote_setup import keep_certificate

    clock = Clock()
    keeper = ServerCertificate(signing_api(ca), "node-a", ["10.0.0.1"], tmp_path, now=clock)
    first = keeper.obtain(wait_s=1, poll_s=0)
    clock.now += LIFETIME * 0.7  # two thirds gone: due at once

    class Server:
        reloads = 0

        def reload(self) -> bool:
            Server.reloads += 1
            clock.now = dt.datetime.now(dt.UTC)  # the renewed one is fresh: the loop then sleeps
            return True

    async def scenario() -> None:
        task = asyncio.create_task(keep_certificate(keeper, Server(), retry_s=0,  # type: ignore[arg-type]
                                                    now=lambda: clock.now.timestamp()))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if Server.reloads:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert Server.reloads == 1
    renewed = keeper.current()
    assert renewed is not None and renewed.serial_number != first.serial_number


def test_reload_signals_the_running_server_which_keeps_running(tmp_path: Path) -> None:
    """SIGHUP, not a restart: the same process goes on (a restart would close its clients)."""
    from gpupool.nodeagent.remote_serving import ServerProcess

    marker = tmp_path / "hup"
    program = ("import pathlib, signal, sys, time; "
               "signal.signal(signal.SIGHUP, lambda *_: pathlib.Path(sys.argv[1]).write_text('hup')); "
               "pathlib.Path(sys.argv[1] + '.ready').touch(); time.sleep(60)")

    async def scenario() -> tuple[bool, bool, int]:
        server = ServerProcess([sys.executable, "-c", program, str(marker)], restart_s=30)
        idle = server.reload()  # nothing runs yet
        task = asyncio.create_task(server.run())
        while not marker.with_suffix(".ready").exists():
            await asyncio.sleep(0.01)
        first = server.process
        told = server.reload()
        for _ in range(300):
            if marker.exists():
                break
            await asyncio.sleep(0.01)
        same = server.process is first and first is not None and first.returncode is None
        starts = server.starts
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return idle, told and same, starts

    assert asyncio.run(scenario()) == (False, True, 1)
    assert marker.read_text() == "hup"


@pytest.mark.slow  # imports the CLI
def test_the_agents_flag_asks_for_the_certificate_of_the_endpoints_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.nodeagent.test_remote_server import agent_remote

    code, output, remote = agent_remote(monkeypatch, "--remote-gpu-server", "0.0.0.0:9420",
                                        "--remote-gpu-endpoint", "10.0.0.7:9420", "--remote-gpu-tls-from-cluster")
    assert code == 0, output
    assert remote.own_certificate == ("10.0.0.7",) and remote.client_ca is None
    command = remote.command()
    assert command[command.index("--tls-cert") + 1] == "/run/gp/remote-gpu-tls.crt"
    assert command[command.index("--tls-key") + 1] == "/run/gp/remote-gpu-tls.key"
    code, output, _ = agent_remote(monkeypatch, "--remote-gpu-server", "0.0.0.0:9420",
                                   "--remote-gpu-endpoint", "gpu-1.example:9420", "--remote-gpu-tls-from-cluster")
    assert code == 2 and "names the IP clients dial" in output
    code, output, _ = agent_remote(monkeypatch, "--remote-gpu-tls-from-cluster")
    assert code == 2 and "needs --remote-gpu-server" in output
