"""The images real-container tests run, built locally from the host's files and cached by content.

Three kinds, all tagged ``gpupool.local/<name>:<content key>`` (pods use them with
``imagePullPolicy: Never``; nothing is ever pulled):

* :func:`pause_image`: the sandbox ("pause") container, ``build/pause/linux/pause.c`` of the
  Kubernetes source tree the test environment already unpacks, linked statically.
* :func:`busybox_image`: ``busybox-static`` and its applet links: a shell, ``sleep``, ``cat`` ...
  Statically linked, so ``LD_PRELOAD`` and ``/etc/ld.so.preload`` do nothing in it.
* :func:`dynamic_image` / :func:`build_image`: busybox plus the host's dynamic loader and C library
  (:data:`LOADER_FILES`), so that dynamically linked programs built on the host run in it and load
  preloaded or stand-in libraries (``libcuda.so.1``). Add files with ``files={container path: host
  path}``; put libraries in :data:`LIB_DIR` (the loader's default search directory) or name them in
  ``LD_LIBRARY_PATH``/``LD_PRELOAD``.

Each archive lands in ``<cache>/images/<name>-<key>.tar`` (``<cache>`` as in
:mod:`gpupool.testenv.paths`); the key is the SHA-256 of the layer and config, so changed inputs
make a new image and unchanged ones reuse the file. Hand an :class:`Image` to
``Kubelet.import_image`` (``ctr images import``) before a pod names its :attr:`Image.ref`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from gpupool.testenv.build import kubernetes_source
from gpupool.testenv.errors import BuildFailedError
from gpupool.testenv.image_archive import Entry, docker_archive, image_config, layer_tar, sha256_digest
from gpupool.testenv.paths import cache_dir
from gpupool.testenv.runtime_tools import RuntimeTools, ensure_runtime_tools

#: The registry part of every local image's name (never contacted: pods say ``pullPolicy: Never``).
REGISTRY = "gpupool.local"

#: How many hex digits of the content key tag an image.
KEY_LENGTH = 16

#: The multiarch library directory, on the host (merged ``/usr``) and in the dynamic image.
LIB_DIR = "/lib/x86_64-linux-gnu"

#: Container path → host path of the loader and the C library (glibc 2.36 keeps libdl, libpthread
#: and librt as small stubs that old programs still name).
LOADER_FILES = {
    f"{LIB_DIR}/ld-linux-x86-64.so.2": Path(f"{LIB_DIR}/ld-linux-x86-64.so.2"),
    f"{LIB_DIR}/libc.so.6": Path(f"{LIB_DIR}/libc.so.6"),
    f"{LIB_DIR}/libdl.so.2": Path(f"{LIB_DIR}/libdl.so.2"),
    f"{LIB_DIR}/libpthread.so.0": Path(f"{LIB_DIR}/libpthread.so.0"),
    f"{LIB_DIR}/libm.so.6": Path(f"{LIB_DIR}/libm.so.6"),
    f"{LIB_DIR}/librt.so.1": Path(f"{LIB_DIR}/librt.so.1"),
}

#: Where programs look for the loader (``PT_INTERP`` of x86-64 binaries).
LOADER_LINK = "/lib64/ld-linux-x86-64.so.2"

#: Path of the pause source inside the Kubernetes tree.
PAUSE_SOURCE = Path("build/pause/linux/pause.c")


class Base(Enum):
    """What :func:`build_image` puts under the caller's files."""

    NONE = "none"
    BUSYBOX = "busybox"
    DYNAMIC = "dynamic"


@dataclass(frozen=True)
class Image:
    """A built image: ``ref`` is what a pod's ``image:`` names, ``archive`` the docker-archive tar."""

    name: str
    ref: str
    archive: Path


def images_dir() -> Path:
    """``<cache>/images``: the archives and the compiled pause binaries."""
    return cache_dir() / "images"


def build_image(name: str, files: Mapping[str, Path] | None = None, *, base: Base = Base.DYNAMIC,
                cmd: tuple[str, ...] = ("sh",), tools: RuntimeTools | None = None) -> Image:
    """An image of ``base`` plus ``files`` (container path → host file, which replaces a base file
    at the same path); cached by content, so calling it again with the same inputs is cheap.

    ``tools`` default to :func:`~gpupool.testenv.runtime_tools.ensure_runtime_tools` (which
    installs busybox-static, and builds containerd and runc, on first use).
    """
    if not name.replace("-", "").isalnum() or name != name.lower():
        raise ValueError(f"image name must be lower-case letters, digits and '-': {name!r}")
    entries = list(base_entries(base, tools or ensure_runtime_tools()))
    entries += [Entry.host_file(path, source) for path, source in sorted((files or {}).items())]
    return _archive(name, entries, cmd)


def busybox_image(tools: RuntimeTools) -> Image:
    """busybox and its applets, nothing else."""
    return build_image("busybox", tools=tools, base=Base.BUSYBOX)


def dynamic_image(tools: RuntimeTools, files: Mapping[str, Path] | None = None) -> Image:
    """busybox plus the host's loader and C library (and ``files``): runs dynamic programs."""
    return build_image("dynamic", files, tools=tools, base=Base.DYNAMIC)


def pause_image(tools: RuntimeTools) -> Image:
    """The sandbox container: the Kubernetes tree's ``pause.c``, compiled once with ``gcc -static``."""
    source = kubernetes_source() / PAUSE_SOURCE
    text = source.read_bytes()
    binary = images_dir() / f"pause-{hashlib.sha256(text).hexdigest()[:KEY_LENGTH]}"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_name(f".{binary.name}.{os.getpid()}")
        result = subprocess.run([str(tools.gcc), "-Os", "-static", '-DVERSION="gpupool"', "-o", str(tmp),
                                 str(source)], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BuildFailedError(f"gcc -static {source} failed:\n{result.stderr[-2000:]}")
        tmp.replace(binary)
    return _archive("pause", [Entry.host_file("/pause", binary)], ("/pause",))


def base_entries(base: Base, tools: RuntimeTools) -> Iterable[Entry]:
    """The files of a base (busybox: the binary, its applet links, the usual empty directories)."""
    if base is Base.NONE:
        return []
    entries = [Entry.host_file("/bin/busybox", tools.busybox)]
    entries += [Entry.symlink(f"/{applet}", "/bin/busybox") for applet in busybox_applets(tools.busybox)]
    entries += [Entry.directory(d) for d in ("/dev", "/proc", "/sys", "/etc", "/root", "/var")]
    entries += [Entry.directory("/tmp", 0o1777),
                Entry("/etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\n"),
                Entry("/etc/group", data=b"root:x:0:\n")]
    if base is Base.DYNAMIC:
        entries += [Entry.host_file(path, source) for path, source in LOADER_FILES.items()]
        entries.append(Entry.symlink(LOADER_LINK, f"{LIB_DIR}/ld-linux-x86-64.so.2"))
    return entries


def busybox_applets(busybox: Path) -> list[str]:
    """Relative install paths of busybox's applets (``bin/sh``, ``usr/bin/env`` ...), except
    ``busybox`` itself: a link named ``bin/busybox`` pointing at ``/bin/busybox`` would replace the
    binary with a link to itself."""
    listing = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True).stdout
    return sorted(line.strip() for line in listing.splitlines()
                  if line.strip() and Path(line.strip()).name != "busybox")


def _archive(name: str, entries: list[Entry], cmd: tuple[str, ...]) -> Image:
    """Write (once) and return the docker archive of ``entries``."""
    layer = layer_tar(entries)
    config = image_config(sha256_digest(layer), cmd=cmd)
    key = hashlib.sha256(layer + config).hexdigest()[:KEY_LENGTH]
    ref = f"{REGISTRY}/{name}:{key}"
    archive = images_dir() / f"{name}-{key}.tar"
    if not archive.is_file():
        archive.parent.mkdir(parents=True, exist_ok=True)
        tmp = archive.with_name(f".{archive.name}.{os.getpid()}")
        tmp.write_bytes(docker_archive(ref, layer, config))
        tmp.replace(archive)
    return Image(name=name, ref=ref, archive=archive)
