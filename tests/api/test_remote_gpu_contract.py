"""The clients file contract between the node agent and the GPU server (gpupool.api.remote_gpu)."""

from __future__ import annotations

import json

import pytest

from gpupool.api.remote_gpu import ClientsFileError, RemoteClient, decode_clients, encode_clients, parse_endpoint
from gpupool.nodeagent.remote_server import ServedShare, clients_text

TOKEN = "A" * 43


def client(token: str = TOKEN, **changes: object) -> RemoteClient:
    values: dict[str, object] = {"token": token, "pod": "ns/pod-1", "card_uuid": "GPU-1234", "memory_mib": 4096,
                                 "compute_percent": 30}
    values.update(changes)
    return RemoteClient(**values)  # type: ignore[arg-type]


def test_round_trip() -> None:
    clients = [client(), client("b" * 40, pod="ns/pod-2", compute_percent=0)]
    assert decode_clients(encode_clients(clients)) == clients


def test_the_node_agents_file_reads() -> None:
    """The control plane writes the file with its own encoder: this reader takes it."""
    share = ServedShare(pod="ns/p", pod_uid="u1", card_uuid="GPU-9", memory_mib=8192, compute_percent=30)
    assert decode_clients(clients_text([share], {"u1": TOKEN})) == [
        RemoteClient(TOKEN, "ns/p", "GPU-9", 8192, 30)]


@pytest.mark.parametrize(("text", "reason"), [
    ("nope", "not JSON"),
    ("[]", "JSON object"),
    ('{"version": 2, "clients": []}', "version 2"),
    ('{"version": 1, "clients": {}}', "must be a list"),
    ('{"version": 1, "clients": [1]}', "must be an object"),
    ('{"version": 1, "clients": [{"token": "x"}]}', "missing pod"),
])
def test_bad_files_say_why(text: str, reason: str) -> None:
    with pytest.raises(ClientsFileError, match=reason):
        decode_clients(text)


@pytest.mark.parametrize(("changes", "reason"), [
    ({"token": "short"}, "token must be"),
    ({"token": "x" * 40 + "!"}, "token must be"),
    ({"pod": "nopod"}, "namespace/name"),
    ({"card_uuid": ""}, "card UUID"),
    ({"memory_mib": 0}, "at least 1"),
    ({"memory_mib": True}, "memory_mib"),
    ({"compute_percent": 101}, "compute_percent"),
])
def test_bad_clients_refused(changes: dict[str, object], reason: str) -> None:
    entry = {"token": TOKEN, "pod": "ns/p", "card_uuid": "GPU-1", "memory_mib": 1, "compute_percent": 0, **changes}
    with pytest.raises(ClientsFileError, match=reason):
        decode_clients(json.dumps({"version": 1, "clients": [entry]}))


def test_token_never_in_the_message() -> None:
    secret = "s" * 31
    with pytest.raises(ClientsFileError) as caught:
        client(secret)
    assert secret not in str(caught.value)


def test_duplicate_tokens_refused() -> None:
    with pytest.raises(ClientsFileError, match="also another"):
        encode_clients([client(), client(pod="ns/other")])


def test_endpoint() -> None:
    assert parse_endpoint("10.0.0.1:7000") == ("10.0.0.1", 7000)
    assert parse_endpoint("[::1]:7000") == ("::1", 7000)
    for bad in ("host", "host:0", ":80", "h:x"):
        with pytest.raises(ValueError, match="host:port"):
            parse_endpoint(bad)


def test_grant_carries_the_remote_endpoint_and_token() -> None:
    from gpupool.api.shim_contract import NodeGrant, decode_grant, encode_grant

    local = NodeGrant((4096,), (30,), "hard", ("GPU-1",), "/r", "/s", "t", "ns/p", "main")
    assert "remote_" not in encode_grant(local)
    remote = NodeGrant((4096,), (30,), "hard", ("GPU-1",), "/r", "/s", "t", "ns/p", "main",
                       remote_endpoint="10.0.0.7:7000", remote_token=TOKEN)
    text = encode_grant(remote)
    assert f"remote_endpoint=10.0.0.7:7000\nremote_token={TOKEN}\n" in text
    assert decode_grant(text) == remote


def test_a_client_of_two_cards_is_written_with_card_uuids_and_reads_back() -> None:
    two = client(more_card_uuids=("GPU-5678",))
    [entry] = json.loads(encode_clients([two]))["clients"]
    assert entry["card_uuids"] == ["GPU-1234", "GPU-5678"] and "card_uuid" not in entry
    assert decode_clients(encode_clients([two, client("b" * 40)])) == [two, client("b" * 40)]
    assert two.card_uuids == ("GPU-1234", "GPU-5678")


def test_a_one_card_entry_of_before_still_reads_and_is_written_the_same() -> None:
    """The exact file a node agent wrote before several cards: its reader takes it unchanged."""
    text = ('{\n "clients": [\n  {\n   "card_uuid": "GPU-1234",\n   "compute_percent": 30,\n   "memory_mib": 4096,\n'
            f'   "pod": "ns/pod-1",\n   "token": "{TOKEN}"\n  }}\n ],\n "version": 1\n}}\n')
    assert decode_clients(text) == [client()] and client().card_uuids == ("GPU-1234",)
    assert encode_clients([client()]) == text


@pytest.mark.parametrize(("changes", "reason"), [
    ({"card_uuids": ["GPU-1", "GPU-2"]}, "card_uuid \\(or card_uuids, not both\\)"),
    ({"card_uuid": None, "card_uuids": []}, "must be a list of card UUIDs"),
    ({"card_uuid": None, "card_uuids": ["GPU-1", "GPU-1"]}, "a card is listed twice"),
    ({"card_uuid": None, "card_uuids": ["GPU-1", "GPU,2"]}, "is not a card UUID"),
    ({"card_uuid": None, "card_uuids": [f"GPU-{i}" for i in range(17)]}, "at most 16 cards"),
])
def test_bad_lists_of_cards_refused(changes: dict[str, object], reason: str) -> None:
    entry: dict[str, object] = {"token": TOKEN, "pod": "ns/p", "card_uuid": "GPU-1", "memory_mib": 1,
                                "compute_percent": 0, **changes}
    entry = {k: v for k, v in entry.items() if v is not None}
    with pytest.raises(ClientsFileError, match=reason):
        decode_clients(json.dumps({"version": 1, "clients": [entry]}))


def test_the_c_servers_mirror_lists_a_clients_cards_comma_separated() -> None:
    from gpupool.remotegpu.serve import mirror_text
    assert mirror_text([client(more_card_uuids=("GPU-5678",)), client("b" * 40)]) == (
        f"{TOKEN}\tns/pod-1\tGPU-1234,GPU-5678\t4096\t30\n{'b' * 40}\tns/pod-1\tGPU-1234\t4096\t30\n")
