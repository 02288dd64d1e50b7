"""The library ↔ agent contract: paths, the optional env variables, the registration line codec."""

from __future__ import annotations

import json

import pytest

from gpupool.api import environment as env
from gpupool.api import shim_contract as sc
from gpupool.api.environment import CardShare, ContainerEnvironment, EnvContractError

TOKEN = "ab" * 32


def test_paths_are_the_contract_text() -> None:
    assert sc.CONTAINER_LIBRARY_PATH == "/usr/local/gpupool/lib/libgpupool-shim.so"
    assert sc.PRELOAD_PATH == "/etc/ld.so.preload"
    assert sc.PRELOAD_LINE == "/usr/local/gpupool/lib/libgpupool-shim.so\n"
    assert sc.CONTAINER_SHIM_DIR == "/var/run/gpupool"
    assert sc.CONTAINER_AGENT_SOCKET == "/var/run/gpupool-agent/agent.sock"
    assert (sc.TOKEN_FILE, sc.REGION_FILE, sc.MAX_LINE_BYTES) == ("token", "memory.region", 4096)


def test_optional_variables_are_not_required_and_the_version_stays() -> None:
    written = ContainerEnvironment("ns/p", "c", (CardShare(0, "GPU-a", 4096, 30),))
    variables = written.to_env()
    assert not set(env.OPTIONAL) & set(variables)
    assert not set(env.OPTIONAL) & set(env.ALL)
    assert env.ENV_VERSION == "1"
    with_shim = {**variables, env.SHIM_TOKEN: TOKEN, env.COMPUTE_MODE: "soft"}
    assert ContainerEnvironment.from_env(with_shim) == written


@pytest.mark.parametrize(("value", "mode"), [
    pytest.param(None, "hard", id="absent-is-hard"),
    pytest.param("hard", "hard", id="hard"),
    pytest.param("soft", "soft", id="soft"),
])
def test_compute_mode(value: str | None, mode: str) -> None:
    assert env.compute_mode({} if value is None else {env.COMPUTE_MODE: value}) == mode


def test_an_unknown_compute_mode_is_an_error() -> None:
    with pytest.raises(EnvContractError, match="'fast': expected one of hard, soft"):
        env.compute_mode({env.COMPUTE_MODE: "fast"})


def test_request_round_trip_and_wire_form() -> None:
    request = sc.RegisterRequest(TOKEN, 42, "ns/p", "main")
    line = sc.encode_request(request)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"v": 1, "op": "register", "token": TOKEN, "pid": 42, "pod": "ns/p",
                                "container": "main"}
    assert sc.decode_request(line) == request


def _doc(**changes: object) -> bytes:
    doc: dict[str, object] = {"v": 1, "op": "register", "token": TOKEN, "pid": 42, "pod": "ns/p", "container": "c"}
    doc.update(changes)
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode() + b"\n"


@pytest.mark.parametrize(("line", "reason"), [
    pytest.param(b"hello\n", "not a JSON line", id="not-json"),
    pytest.param(b"\xff\xfe\n", "not a JSON line", id="not-utf8"),
    pytest.param(b"[1,2]\n", "not a JSON object", id="not-an-object"),
    pytest.param(_doc(v=2), "this agent speaks version 1", id="other-version"),
    pytest.param(_doc(v=...), "v None", id="no-version"),
    pytest.param(_doc(op="unregister"), "only 'register' is known", id="unknown-op"),
    pytest.param(_doc(token="AB" * 32), "64 lower-case hex digits", id="upper-case-token"),
    pytest.param(_doc(token="ab" * 31), "64 lower-case hex digits", id="short-token"),
    pytest.param(_doc(token=...), "64 lower-case hex digits", id="no-token"),
    pytest.param(_doc(pid=0), "positive integer", id="pid-zero"),
    pytest.param(_doc(pid="12"), "positive integer", id="pid-string"),
    pytest.param(_doc(pid=True), "positive integer", id="pid-bool"),
    pytest.param(_doc(container=["c"]), "container: expected a string", id="container-not-string"),
    pytest.param(_doc(pod="x" * 600), "pod: expected a string of at most 512", id="pod-too-long"),
    pytest.param(b"{" + b" " * 5000 + b"}\n", "exceeds 4096", id="oversized"),
])
def test_malformed_requests_say_why(line: bytes, reason: str) -> None:
    with pytest.raises(sc.ShimProtocolError, match=reason.replace("(", r"\(")):
        sc.decode_request(line)


@pytest.mark.parametrize("reply", [
    pytest.param(sc.RegisterReply(True), id="ok"),
    pytest.param(sc.RegisterReply(True, host_pid=48213), id="ok-with-host-pid"),
    pytest.param(sc.RegisterReply(False, "unknown token"), id="refused"),
])
def test_reply_round_trip(reply: sc.RegisterReply) -> None:
    assert sc.decode_reply(sc.encode_reply(reply)) == reply


def test_a_long_reason_still_fits_one_line() -> None:
    line = sc.encode_reply(sc.RegisterReply(False, "x" * 10_000))
    assert len(line) <= sc.MAX_LINE_BYTES and not sc.decode_reply(line).ok


def test_the_host_pid_is_on_the_wire_as_hostpid() -> None:
    assert sc.encode_reply(sc.RegisterReply(True, host_pid=48213)) == b'{"v":1,"ok":true,"hostPid":48213}\n'


def test_a_refusal_never_carries_a_host_pid() -> None:
    assert b"hostPid" not in sc.encode_reply(sc.RegisterReply(False, "unknown token", host_pid=48213))


def test_a_reply_without_host_pid_from_an_older_agent_is_valid() -> None:
    assert sc.decode_reply(b'{"v":1,"ok":true}\n') == sc.RegisterReply(True, "", None)


@pytest.mark.parametrize("value", [
    pytest.param("48213", id="string"),
    pytest.param(0, id="zero"),
    pytest.param(-5, id="negative"),
    pytest.param(True, id="boolean"),
    pytest.param(1.5, id="float"),
])
def test_a_malformed_host_pid_says_why(value: object) -> None:
    line = json.dumps({"v": 1, "ok": True, "hostPid": value}).encode()
    with pytest.raises(sc.ShimProtocolError, match="hostPid: expected a positive integer"):
        sc.decode_reply(line)


def test_a_busy_refusal_says_retry_and_other_refusals_do_not() -> None:
    busy = sc.encode_reply(sc.RegisterReply(False, "busy", retry=True))
    assert b'"retry":true' in busy and sc.decode_reply(busy).retry
    final = sc.encode_reply(sc.RegisterReply(False, "unknown token"))
    assert b"retry" not in final and not sc.decode_reply(final).retry
    assert not sc.decode_reply(b'{"v":1,"ok":true,"retry":true}\n').retry  # only a refusal is retried
    with pytest.raises(sc.ShimProtocolError, match="retry"):
        sc.decode_reply(b'{"v":1,"ok":false,"reason":"x","retry":"yes"}\n')
