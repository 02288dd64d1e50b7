"""Container images as docker-archive tars, written from a map of files (no registry, no engine).

``ctr images import`` reads the ``docker save`` format: a tar holding ``manifest.json`` (config and
layer names, the image's tag), the image config (whose ``rootfs.diff_ids`` lists each layer's
SHA-256) and the layers themselves (plain tars). Every image here has one layer, built from an
:class:`Entry` list, and is byte-for-byte reproducible (sorted names, owner 0, a fixed time): the
same inputs give the same digest, which names the image in the cache and in its tag.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

#: Modification time of every file in a layer (reproducible layers; 2000-01-01, not 0, which some
#: tools read as "unset").
LAYER_MTIME = 946684800

#: ``PATH`` of every image (where busybox's applets and the loader's programs live).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Entry:
    """One path in a layer: a regular file (``source`` on the host, or ``data``), a directory, or a
    symbolic link (``link``)."""

    path: str
    source: Path | None = None
    data: bytes | None = None
    link: str | None = None
    mode: int = 0o644

    def __post_init__(self) -> None:
        if not PurePosixPath(self.path).is_absolute() or ".." in PurePosixPath(self.path).parts:
            raise ValueError(f"an image path must be absolute and without '..': {self.path!r}")
        if sum(x is not None for x in (self.source, self.data, self.link)) > 1:
            raise ValueError(f"{self.path}: give at most one of source, data, link")

    @property
    def is_dir(self) -> bool:
        return self.source is None and self.data is None and self.link is None

    @classmethod
    def host_file(cls, path: str, source: Path) -> Entry:
        """A copy of host file ``source`` (symlinks followed), keeping its permission bits."""
        resolved = source.resolve(strict=True)
        if not resolved.is_file():
            raise ValueError(f"{source} is not a regular file")
        return cls(path, source=resolved, mode=resolved.stat().st_mode & 0o7777)

    @classmethod
    def directory(cls, path: str, mode: int = 0o755) -> Entry:
        return cls(path, mode=mode)

    @classmethod
    def symlink(cls, path: str, target: str) -> Entry:
        return cls(path, link=target, mode=0o777)


def with_parents(entries: Iterable[Entry]) -> list[Entry]:
    """``entries`` plus a directory entry for every parent they lack; a later entry for the same
    path replaces an earlier one (so an extra file can replace a base image's file)."""
    by_path: dict[str, Entry] = {}
    for entry in entries:
        for parent in reversed(PurePosixPath(entry.path).parents):
            if str(parent) != "/" and str(parent) not in by_path:
                by_path[str(parent)] = Entry.directory(str(parent))
        by_path[entry.path] = entry
    return [by_path[p] for p in sorted(by_path)]


def layer_tar(entries: Iterable[Entry]) -> bytes:
    """The layer as an uncompressed tar, reproducible for the same entries."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in with_parents(entries):
            info = tarfile.TarInfo(entry.path.lstrip("/"))
            info.mtime, info.mode, info.uid, info.gid = LAYER_MTIME, entry.mode, 0, 0
            if entry.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.link
                tar.addfile(info)
            elif entry.is_dir:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                data = entry.data if entry.data is not None else entry.source.read_bytes()  # type: ignore[union-attr]
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def image_config(layer_digest: str, *, cmd: tuple[str, ...] = ("sh",), env: tuple[str, ...] = ()) -> bytes:
    """The image config JSON naming one layer by its ``sha256:`` digest."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": [f"PATH={DEFAULT_PATH}", *env], "Cmd": list(cmd), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    return json.dumps(config, sort_keys=True).encode()


def docker_archive(ref: str, layer: bytes, config: bytes) -> bytes:
    """A ``docker save`` tar holding one image tagged ``ref``."""
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    layer_name = f"{hashlib.sha256(layer).hexdigest()}/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((config_name, config), (layer_name, layer), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), LAYER_MTIME, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>``, the form of ``diff_ids``."""
    return f"sha256:{hashlib.sha256(data).hexdigest()}"
