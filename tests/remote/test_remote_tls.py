"""TLS between the GPU client and server: the client checks the server's certificate against its
CA and the address it dialled; the token then goes inside the encrypted connection."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpupool.extender.http.certificates import KeyPair, issue_ca
from gpupool.extender.remote_gpu_signer import RequestSigner
from gpupool.nodeagent.remote_certificate import ServerCertificate
from tests.extender.csr_fakes import FakeCsrApi, node_json
from tests.remote.remote_support import (
    Programs,
    build_programs,
    client,
    make_certificates,
    probe_env,
    run_probe,
    running_server,
    token,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")]


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    return build_programs(tmp_path_factory.mktemp("remote-programs"))


def test_vector_add_over_tls(programs: Programs, tmp_path: Path) -> None:
    certs = make_certificates(tmp_path)
    with running_server(programs, tmp_path, [client("a")],
                        extra=["--tls-cert", str(certs.certificate), "--tls-key", str(certs.key)]) as server:
        env = {**probe_env(programs, f"127.0.0.1:{server.port}", token("a")), "GPUPOOL_REMOTE_TLS_CA": str(certs.ca)}
        out = run_probe(programs, env, "vector_add", "100000")
        forged = run_probe(programs, {**env, "GPUPOOL_REMOTE_TOKEN": token("z")}, "vector_add", "1")
        assert server.process.poll() is None
    assert out == "ok vector_add 100000 c[99999]=149998"
    assert forged == "error 800 at cuInit(0)"


def test_a_server_the_ca_did_not_sign_is_refused(programs: Programs, tmp_path: Path) -> None:
    certs = make_certificates(tmp_path)
    other = make_certificates(tmp_path, name="other")
    with running_server(programs, tmp_path, [client("a")],
                        extra=["--tls-cert", str(certs.certificate), "--tls-key", str(certs.key)]) as server:
        env = {**probe_env(programs, f"127.0.0.1:{server.port}", token("a")), "GPUPOOL_REMOTE_TLS_CA": str(other.ca)}
        assert run_probe(programs, env, "vector_add", "1") == "error 46 at cuInit(0)"


def test_a_certificate_for_another_address_is_refused(programs: Programs, tmp_path: Path) -> None:
    certs = make_certificates(tmp_path, addresses=("10.9.9.9",))
    with running_server(programs, tmp_path, [client("a")],
                        extra=["--tls-cert", str(certs.certificate), "--tls-key", str(certs.key)]) as server:
        env = {**probe_env(programs, f"127.0.0.1:{server.port}", token("a")), "GPUPOOL_REMOTE_TLS_CA": str(certs.ca)}
        assert run_probe(programs, env, "vector_add", "1") == "error 46 at cuInit(0)"


def test_the_grant_directorys_ca_turns_tls_on(programs: Programs, tmp_path: Path) -> None:
    """A pod's grant Secret holding remote_tls_ca.pem (the agent's --remote-gpu-tls-ca), mounted
    where GPUPOOL_REMOTE_DIR names: the client speaks TLS and checks the server against it."""
    certs = make_certificates(tmp_path)
    secret = tmp_path / "secret"
    secret.mkdir()
    with running_server(programs, tmp_path, [client("a")],
                        extra=["--tls-cert", str(certs.certificate), "--tls-key", str(certs.key)]) as server:
        (secret / "remote_endpoint").write_text(f"127.0.0.1:{server.port}")
        (secret / "remote_token").write_text(token("a"))
        env = {k: v for k, v in probe_env(programs, "", "").items() if not k.startswith("GPUPOOL_REMOTE_")}
        env["GPUPOOL_REMOTE_DIR"] = str(secret)
        plain = run_probe(programs, env, "vector_add", "10")
        shutil.copy(certs.ca, secret / "remote_tls_ca.pem")
        out = run_probe(programs, env, "vector_add", "10")
    assert plain.startswith("error ")  # without the CA the client speaks plain TCP: the TLS server refuses it
    assert out.startswith("ok vector_add 10")


def test_a_plain_client_gets_no_service_from_a_tls_server(programs: Programs, tmp_path: Path) -> None:
    certs = make_certificates(tmp_path)
    with running_server(programs, tmp_path, [client("a")],
                        extra=["--tls-cert", str(certs.certificate), "--tls-key", str(certs.key)]) as server:
        env = probe_env(programs, f"127.0.0.1:{server.port}", token("a"), deadline_ms=8000)
        assert run_probe(programs, env, "vector_add", "1") == "error 46 at cuInit(0)"


def test_tls_with_the_client_under_the_interception_library(programs: Programs, tmp_path: Path) -> None:
    """--enforce-compute: the connection's process keeps TLS and relays to the client's executor."""
    certs = make_certificates(tmp_path)
    tls = ["--tls-cert", str(certs.certificate), "--tls-key", str(certs.key)]
    with running_server(programs, tmp_path, [client("a")], extra=["--enforce-compute", *tls]) as server:
        env = {**probe_env(programs, f"127.0.0.1:{server.port}", token("a")), "GPUPOOL_REMOTE_TLS_CA": str(certs.ca)}
        out = run_probe(programs, env, "vector_add", "100000")
        forged = run_probe(programs, {**env, "GPUPOOL_REMOTE_TOKEN": token("z")}, "vector_add", "1")
    assert out == "ok vector_add 100000 c[99999]=149998"
    assert forged == "error 800 at cuInit(0)"


def _node_certificate(tmp_path: Path, node: str, addresses: tuple[str, ...], signer_ca: KeyPair) -> ServerCertificate:
    """The node agent's own certificate as the cluster's signer issues it (key made in ``tmp_path``)."""
    api = FakeCsrApi(node=node)
    nodes = {"node-a": node_json("node-a", "127.0.0.1"), "node-b": node_json("node-b", "127.0.0.2")}
    signer = RequestSigner(api, signer_ca, nodes.get)
    api.on_create = lambda request: signer.answer(request)
    keeper = ServerCertificate(api, node, addresses, tmp_path / node)
    keeper.obtain(wait_s=1, poll_s=0)
    return keeper


def test_a_nodes_own_certificate_from_the_signer_serves_its_address_only(programs: Programs, tmp_path: Path) -> None:
    """The node agent's --remote-gpu-tls-from-cluster files: the chain (certificate then CA) and the key
    made on the node; the client checks them with the CA the agent hands out (the chain's last).
    node-b's certificate (its address 127.0.0.2) on the address a client dialled for node-a is refused."""
    ca = issue_ca("gpupool-remote-gpu-ca")
    own = _node_certificate(tmp_path, "node-a", ("127.0.0.1",), ca)
    other = _node_certificate(tmp_path, "node-b", ("127.0.0.2",), ca)
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(own.ca_pem() or "")
    answers = []
    for keeper in (own, other):
        files = ["--tls-cert", str(keeper.cert_path), "--tls-key", str(keeper.key_path)]
        with running_server(programs, tmp_path, [client("a")], extra=files) as server:
            env = {**probe_env(programs, f"127.0.0.1:{server.port}", token("a")), "GPUPOOL_REMOTE_TLS_CA": str(ca_file)}
            answers.append(run_probe(programs, env, "vector_add", "1000"))
    assert answers == ["ok vector_add 1000 c[999]=1498.5", "error 46 at cuInit(0)"]


def test_the_client_checks_the_certificate_names_the_node_it_was_scheduled_to(programs: Programs,
                                                                                tmp_path: Path) -> None:
    """A node's own certificate names its node too; a client told its server node (remote_server_name
    beside the library, as install-client --check-server-name writes it, or GPUPOOL_REMOTE_SERVER_NAME)
    refuses a certificate for another node even at the address it dialled."""
    ca = issue_ca("gpupool-remote-gpu-ca")
    keeper = _node_certificate(tmp_path, "node-a", ("127.0.0.1",), ca)
    ca_file = tmp_path / "ca.pem"
    ca_file.write_text(keeper.ca_pem() or "")
    lib = tmp_path / "lib"  # the pod's emptyDir: the client and the node it was scheduled to
    lib.mkdir()
    shutil.copy(programs.client / "libcuda.so.1", lib / "libcuda.so.1")
    answers = {}
    files = ["--tls-cert", str(keeper.cert_path), "--tls-key", str(keeper.key_path)]
    with running_server(programs, tmp_path, [client("a")], extra=files) as server:
        env = {**probe_env(programs, f"127.0.0.1:{server.port}", token("a")), "GPUPOOL_REMOTE_TLS_CA": str(ca_file)}
        for scheduled in ("node-a", "node-b"):
            answers[f"env {scheduled}"] = run_probe(programs, {**env, "GPUPOOL_REMOTE_SERVER_NAME": scheduled},
                                                    "vector_add", "10")
            (lib / "remote_server_name").write_text(f"{scheduled}\n")
            answers[f"file {scheduled}"] = run_probe(programs, {**env, "LD_LIBRARY_PATH": str(lib)}, "vector_add", "10")
    assert answers == {"env node-a": "ok vector_add 10 c[9]=13.5", "file node-a": "ok vector_add 10 c[9]=13.5",
                       "env node-b": "error 46 at cuInit(0)", "file node-b": "error 46 at cuInit(0)"}
