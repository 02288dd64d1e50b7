"""Tokens derived from a kept secret, and the host files behind the library's mounts."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpupool.api.shim_contract import PRELOAD_LINE, is_token
from gpupool.nodeagent.isolation.shim_files import (
    ShimFileError,
    ShimLayout,
    existing_containers,
    parse_container_dir,
    prepare_container,
    prepare_node,
    remove_container,
)
from gpupool.nodeagent.isolation.tokens import SecretError, TokenSigner, load_or_create_secret

UID = "0f3c9a2e-1b7d-4c1e-9a55-3f2b8c7d6e10"


def test_the_token_depends_on_pod_container_and_secret_only(tmp_path: Path) -> None:
    signer = TokenSigner(load_or_create_secret(str(tmp_path / "secret")))
    token = signer.token(UID, "main")
    assert is_token(token)
    assert signer.token(UID, "main") == token
    others = {signer.token(UID, "side"), signer.token(UID.replace("0f", "1f"), "main"),
              TokenSigner(b"x" * 32).token(UID, "main")}
    assert token not in others and len(others) == 3


def test_the_secret_survives_a_restart_and_is_private(tmp_path: Path) -> None:
    path = str(tmp_path / "state" / "secret")
    first = load_or_create_secret(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_or_create_secret(path) == first
    assert TokenSigner(first).token(UID, "c") == TokenSigner(load_or_create_secret(path)).token(UID, "c")


def test_agents_starting_together_share_one_secret(tmp_path: Path) -> None:
    path = str(tmp_path / "secret")
    with ThreadPoolExecutor(8) as pool:
        secrets = set(pool.map(lambda _: load_or_create_secret(path), range(32)))
    assert len(secrets) == 1
    assert sorted(os.listdir(tmp_path)) == ["secret"]  # no temporary file left behind


def test_a_damaged_secret_is_reported_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"short")
    with pytest.raises(SecretError, match="5 bytes, expected 32; remove it"):
        load_or_create_secret(str(path))
    assert path.read_bytes() == b"short"


def test_node_files(tmp_path: Path) -> None:
    layout = ShimLayout(str(tmp_path))
    prepare_node(layout)
    prepare_node(layout)  # idempotent
    assert Path(layout.preload).read_text() == PRELOAD_LINE
    assert stat.S_IMODE(os.stat(layout.containers).st_mode) == 0o700
    assert layout.socket == str(tmp_path / "agent-socket" / "agent.sock")
    assert not Path(layout.secret).is_relative_to(layout.socket_dir)


def test_container_directory_is_made_once_and_holds_the_token(tmp_path: Path) -> None:
    layout = ShimLayout(str(tmp_path))
    prepare_node(layout)
    path = prepare_container(layout, UID, "main", "ab" * 32, "version=1\n")
    assert path == str(tmp_path / "containers" / f"{UID}_main")
    assert Path(path, "token").read_text() == "ab" * 32 + "\n"
    assert Path(path, "grant").read_text() == "version=1\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755  # mounted read-only; was world-writable
    assert Path(path, "memory.region").stat().st_size == 39552  # made by the agent, at its full size
    Path(path, "memory.region").write_bytes(b"\1" * 39552)  # what the container's processes account
    assert prepare_container(layout, UID, "main", "ab" * 32, "version=1\n") == path
    assert Path(path, "memory.region").read_bytes() == b"\1" * 39552
    assert existing_containers(layout) == [(UID, "main")]
    remove_container(layout, UID, "main")
    assert existing_containers(layout) == []


@pytest.mark.parametrize(("uid", "container"), [
    pytest.param("../../etc", "main", id="uid-escapes"),
    pytest.param(UID, "a/b", id="slash-in-container"),
    pytest.param(UID, "Main", id="not-a-dns-label"),
    pytest.param("", "main", id="empty-uid"),
])
def test_names_that_cannot_be_a_directory_are_refused(tmp_path: Path, uid: str, container: str) -> None:
    with pytest.raises(ShimFileError, match="cannot name a directory"):
        ShimLayout(str(tmp_path)).container_dir(uid, container)


@pytest.mark.parametrize(("name", "parsed"), [
    pytest.param(f"{UID}_main", (UID, "main"), id="plain"),
    pytest.param(f"{UID}_side-car-2", (UID, "side-car-2"), id="dashes"),
    pytest.param("lost+found", None, id="foreign"),
    pytest.param(f"{UID}_main.tmp", None, id="temporary"),
])
def test_parse_container_dir(name: str, parsed: tuple[str, str] | None) -> None:
    assert parse_container_dir(name) == parsed
