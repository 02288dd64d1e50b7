"""Image archives and the local images, without containerd: format, reproducibility, cache keys."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from gpupool.testenv import images
from gpupool.testenv.image_archive import Entry, docker_archive, image_config, layer_tar, sha256_digest, with_parents
from gpupool.testenv.paths import CACHE_ENV
from gpupool.testenv.runtime_tools import RuntimeTools


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def _read(data: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.extractfile(name)
        assert member is not None
        return member.read()


@pytest.mark.parametrize("path", [
    pytest.param("relative/file", id="relative"),
    pytest.param("/etc/../../escape", id="dot-dot"),
])
def test_an_entry_path_must_be_absolute_and_stay_inside(path: str) -> None:
    with pytest.raises(ValueError, match="absolute"):
        Entry(path, data=b"x")


def test_an_entry_is_one_kind_only() -> None:
    with pytest.raises(ValueError, match="at most one"):
        Entry("/a", data=b"x", link="/b")


def test_parents_are_added_and_a_later_entry_replaces_an_earlier_one() -> None:
    entries = with_parents([Entry("/usr/lib/x.so", data=b"old"), Entry("/usr/lib/x.so", data=b"new")])
    assert [(e.path, e.is_dir) for e in entries] == [("/usr", True), ("/usr/lib", True), ("/usr/lib/x.so", False)]
    assert entries[-1].data == b"new"


def test_a_layer_is_reproducible_owned_by_root_and_keeps_modes_and_links(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_bytes(b"#!/bin/sh\n")
    tool.chmod(0o750)
    entries = [Entry.host_file("/bin/tool", tool), Entry.symlink("/bin/alias", "/bin/tool"),
               Entry.directory("/tmp", 0o1777)]
    first, second = layer_tar(entries), layer_tar(list(reversed(entries)))
    assert first == second
    members = _members(first)
    assert members["bin/tool"].mode == 0o750 and members["bin/tool"].uid == 0
    assert members["bin/alias"].issym() and members["bin/alias"].linkname == "/bin/tool"
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777
    assert _read(first, "bin/tool") == b"#!/bin/sh\n"


def test_a_docker_archive_names_its_layer_by_the_config_diff_id() -> None:
    layer = layer_tar([Entry("/hello", data=b"hi")])
    config = image_config(sha256_digest(layer), cmd=("/hello",))
    archive = docker_archive("gpupool.local/x:1", layer, config)
    [manifest] = json.loads(_read(archive, "manifest.json"))
    assert manifest["RepoTags"] == ["gpupool.local/x:1"]
    parsed = json.loads(_read(archive, manifest["Config"]))
    layer_digest = hashlib.sha256(_read(archive, manifest["Layers"][0])).hexdigest()
    assert parsed["rootfs"]["diff_ids"] == [f"sha256:{layer_digest}"]
    assert parsed["config"]["Cmd"] == ["/hello"] and parsed["os"] == "linux"


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RuntimeTools:
    """A busybox that lists three applets (one of them itself), and the cache in ``tmp_path``."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    busybox = tmp_path / "busybox"
    busybox.write_text("#!/bin/sh\nprintf 'bin/sh\\nusr/bin/env\\nbin/busybox\\n'\n")
    busybox.chmod(0o755)
    return RuntimeTools(containerd=busybox, ctr=busybox, runc=busybox, busybox=busybox, gcc=busybox, ip=busybox,
                        cni_bin_dir=tmp_path)


def test_busybox_does_not_link_over_itself(fake_tools: RuntimeTools) -> None:
    assert images.busybox_applets(fake_tools.busybox) == ["bin/sh", "usr/bin/env"]
    entries = {e.path: e for e in images.base_entries(images.Base.BUSYBOX, fake_tools)}
    assert entries["/bin/busybox"].source == fake_tools.busybox.resolve()
    assert entries["/bin/sh"].link == "/bin/busybox"


def test_the_dynamic_base_has_the_loader_where_programs_look_for_it(fake_tools: RuntimeTools) -> None:
    entries = {e.path: e for e in images.base_entries(images.Base.DYNAMIC, fake_tools)}
    assert entries[images.LOADER_LINK].link == f"{images.LIB_DIR}/ld-linux-x86-64.so.2"
    assert {f"{images.LIB_DIR}/libc.so.6", f"{images.LIB_DIR}/ld-linux-x86-64.so.2"} <= set(entries)


def test_images_are_cached_by_content(fake_tools: RuntimeTools, tmp_path: Path) -> None:
    lib = tmp_path / "libfake.so"
    lib.write_bytes(b"one")
    first = images.build_image("shim", {"/usr/lib/libfake.so": lib}, tools=fake_tools, base=images.Base.BUSYBOX)
    again = images.build_image("shim", {"/usr/lib/libfake.so": lib}, tools=fake_tools, base=images.Base.BUSYBOX)
    assert again == first and first.archive.is_file()
    assert first.ref == f"{images.REGISTRY}/shim:{first.archive.stem.removeprefix('shim-')}"
    mtime = first.archive.stat().st_mtime_ns
    images.build_image("shim", {"/usr/lib/libfake.so": lib}, tools=fake_tools, base=images.Base.BUSYBOX)
    assert first.archive.stat().st_mtime_ns == mtime  # a hit writes nothing
    lib.write_bytes(b"two")
    changed = images.build_image("shim", {"/usr/lib/libfake.so": lib}, tools=fake_tools, base=images.Base.BUSYBOX)
    assert changed.ref != first.ref and changed.archive != first.archive


@pytest.mark.parametrize("name", [pytest.param("Upper", id="upper-case"), pytest.param("a/b", id="slash"),
                                  pytest.param("a:b", id="colon")])
def test_an_image_name_must_be_a_plain_lower_case_word(fake_tools: RuntimeTools, name: str) -> None:
    with pytest.raises(ValueError, match="image name"):
        images.build_image(name, tools=fake_tools)
