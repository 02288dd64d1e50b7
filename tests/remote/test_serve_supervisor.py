"""``gpupool remote-gpu serve``'s Python side: the clients file mirrored for the C server, the last
good file kept, plain TCP refused off loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.remotegpu.serve import ClientsMirror, RemoteServeError, check_listen, mirror_text
from tests.remote.remote_support import client, token, write_clients


def test_mirror_has_one_line_per_client() -> None:
    assert mirror_text([client("a", 512)]) == f"{token('a')}\tns/pod-a\tGPU-standin-0\t512\t0\n"


def test_mirror_follows_the_file_and_keeps_the_last_good_one(tmp_path: Path) -> None:
    source = tmp_path / "clients.json"
    mirror = ClientsMirror(source, tmp_path / "clients.tab")
    assert mirror.refresh() and mirror.mirror.read_text() == ""  # absent: nobody served
    write_clients(source, [client("a"), client("b")])
    assert mirror.refresh() and mirror.clients == 2
    assert not mirror.refresh()  # unchanged
    source.write_text('{"version": 1, "clients": [{"token": "short"}]}')
    assert not mirror.refresh()
    assert mirror.mirror.read_text() == mirror_text([client("a"), client("b")])
    write_clients(source, [client("b")])
    assert mirror.refresh() and mirror.mirror.read_text() == mirror_text([client("b")])


@pytest.mark.parametrize("listen", ["127.0.0.1:7000", "[::1]:0", "localhost:7000"])
def test_loopback_is_served_plain(listen: str) -> None:
    check_listen(listen, allow_plain=False)


def test_plain_tcp_off_loopback_needs_allow_plain() -> None:
    with pytest.raises(RemoteServeError, match="--allow-plain"):
        check_listen("0.0.0.0:7000", allow_plain=False)
    check_listen("0.0.0.0:7000", allow_plain=True)


def test_bad_listen_address() -> None:
    with pytest.raises(RemoteServeError, match="host:port"):
        check_listen("nowhere", allow_plain=True)


def test_tls_serves_off_loopback_without_allow_plain(tmp_path: Path) -> None:
    from gpupool.remotegpu.serve import TlsFiles

    files = TlsFiles(tmp_path / "server.pem", tmp_path / "server.key")
    with pytest.raises(RemoteServeError, match="not found"):
        check_listen("0.0.0.0:7000", allow_plain=False, tls=files)
    files.certificate.write_text("x")
    files.key.write_text("x")
    check_listen("0.0.0.0:7000", allow_plain=False, tls=files)


def test_client_path_prints_the_directory_of_the_client_library() -> None:
    from click.testing import CliRunner

    from gpupool.cli.main import cli

    result = CliRunner().invoke(cli, ["remote-gpu", "client-path"])
    assert result.exit_code == 0, result.output
    assert (Path(result.output.strip()) / "libcuda.so.1").is_file()
