"""The library backend: what a grant gets, the same every call; directories kept until the pod is
gone long enough; tokens and directories that survive an agent restart."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest

from gpupool.api import environment as env
from gpupool.api.shim_contract import NodeGrant, RegisterRequest, decode_grant, decode_reply, encode_request
from gpupool.core.model import CardSlice, ContainerAssignment, Placement
from gpupool.nodeagent.container_grant import GrantError
from gpupool.nodeagent.containers.cgroup_identity import CgroupIdentity, Runtime
from gpupool.nodeagent.isolation.shim_backend import ShimEnforcement
from gpupool.nodeagent.isolation.shim_files import ShimLayout
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry
from gpupool.nodeagent.types import Mount, NodeAssignment, PodView
from tests.nodeagent.isolation.shim_client import exchange

UID = "0f3c9a2e-1b7d-4c1e-9a55-3f2b8c7d6e10"
UID2 = "1f3c9a2e-1b7d-4c1e-9a55-3f2b8c7d6e10"


def pod(uid: str = UID, name: str = "p") -> PodView:
    """A pod whose containers main and side hold 4 GiB and 30 % of card 1 and 2 GiB of card 3."""
    slices = (CardSlice(1, 4096, 300), CardSlice(3, 2048, 0))
    placement = Placement(f"ns/{name}", "node-a", 0, 0, (ContainerAssignment("main", slices),
                                                         ContainerAssignment("side", slices[:1])))
    return PodView("ns", name, uid, "node-a", 0.0, False, (),
                   assignment=NodeAssignment(placement, {1: "GPU-one", 3: "GPU-three"}))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def backend(state: Path, clock: Clock | None = None, mode: str = "hard") -> ShimEnforcement:
    library = state.parent / "libgpupool-shim.so"
    library.write_bytes(b"\x7fELF")
    registry = ShimRegistry(lambda pid: CgroupIdentity(Runtime.UNKNOWN))
    return ShimEnforcement(str(library), ShimLayout(str(state)), registry, mode, clock=clock or Clock(),
                           gone_after_s=120.0)


def test_the_grant_carries_the_mounts_and_variables_of_the_contract(tmp_path: Path) -> None:
    shim = backend(tmp_path / "state", mode="soft")
    extras = shim.grant_extras(pod(), "main")
    state = tmp_path / "state"
    host_dir = str(state / "containers" / f"{UID}_main")
    assert extras.mounts == (
        Mount(str(state / "shim" / "libgpupool-shim.so"), "/usr/local/gpupool/lib/libgpupool-shim.so", True),
        Mount(str(state / "shim" / "ld.so.preload"), "/etc/ld.so.preload", True),
        Mount(host_dir, "/etc/gpupool", True),
        Mount(f"{host_dir}/memory.region", "/var/run/gpupool/memory.region", False),
        Mount(str(state / "agent-socket"), "/var/run/gpupool-agent", True),
    )
    token = extras.envs[env.SHIM_TOKEN]
    assert extras.envs == {env.SHIM_DIR: "/var/run/gpupool", env.AGENT_SOCKET: "/var/run/gpupool-agent/agent.sock",
                           env.SHIM_TOKEN: token, env.COMPUTE_MODE: "soft"}
    assert Path(host_dir, "token").read_text() == token + "\n"
    assert Path(state / "shim" / "ld.so.preload").read_text() == "/usr/local/gpupool/lib/libgpupool-shim.so\n"


def test_the_grant_file_holds_the_assignment_and_only_the_region_is_writable(tmp_path: Path) -> None:
    """The library's limits come from this file, mounted read-only: the environment cannot raise them."""
    shim = backend(tmp_path / "state", mode="soft")
    extras = shim.grant_extras(pod(), "main")
    host_dir = Path(extras.mounts[2].host_path)
    grant = decode_grant((host_dir / "grant").read_text())
    assert grant == NodeGrant(memory_mib=(4096, 2048), compute_percent=(30, 0), compute_mode="soft",
                              card_uuids=("GPU-one", "GPU-three"), region="/var/run/gpupool/memory.region",
                              socket="/var/run/gpupool-agent/agent.sock", token=extras.envs[env.SHIM_TOKEN],
                              pod="ns/p", container="main")
    side = Path(shim.grant_extras(pod(), "side").mounts[2].host_path)
    assert decode_grant((side / "grant").read_text()).memory_mib == (4096,)
    writable = [m.container_path for m in extras.mounts if not m.read_only]
    assert writable == ["/var/run/gpupool/memory.region"]
    assert oct(host_dir.stat().st_mode & 0o777) == "0o755"  # nothing in it can be deleted or replaced
    assert oct((host_dir / "grant").stat().st_mode & 0o777) == "0o644"
    region = host_dir / "memory.region"
    assert region.stat().st_size == 39552 and oct(region.stat().st_mode & 0o777) == "0o666"


def test_an_existing_region_is_never_reset_by_a_later_grant(tmp_path: Path) -> None:
    """Allocate runs once per resource and again after an agent restart: the account stays."""
    shim = backend(tmp_path / "state")
    region = Path(shim.grant_extras(pod(), "main").mounts[3].host_path)
    region.write_bytes(b"\x01" * 39552)
    shim.grant_extras(pod(), "main")
    backend(tmp_path / "state").grant_extras(pod(), "main")
    assert region.read_bytes() == b"\x01" * 39552


def test_a_container_without_an_assignment_gets_no_grant(tmp_path: Path) -> None:
    shim = backend(tmp_path / "state")
    with pytest.raises(GrantError, match="ns/p/other: no assignment"):
        shim.grant_extras(pod(), "other")
    with pytest.raises(GrantError, match="no assignment"):
        shim.grant_extras(PodView("ns", "p", UID, "node-a", 0.0, False, ()), "main")


def test_every_call_for_a_container_gives_the_same_grant_and_containers_differ(tmp_path: Path) -> None:
    shim = backend(tmp_path / "state")
    first = shim.grant_extras(pod(), "main")
    assert all(shim.grant_extras(pod(), "main") == first for _ in range(5))
    side = shim.grant_extras(pod(), "side")
    other_pod = shim.grant_extras(pod(UID2, "q"), "main")
    tokens = {e.envs[env.SHIM_TOKEN] for e in (first, side, other_pod)}
    dirs = {e.mounts[2].host_path for e in (first, side, other_pod)}
    assert len(tokens) == 3 and len(dirs) == 3


def test_a_directory_that_cannot_be_made_refuses_the_grant(tmp_path: Path) -> None:
    shim = backend(tmp_path / "state")
    Path(shim.layout.containers, f"{UID}_main").write_text("a file where the directory goes")
    with pytest.raises(GrantError, match=f"ns/p/main: cannot prepare .*{UID}_main"):
        shim.grant_extras(pod(), "main")


def test_a_missing_library_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ShimEnforcement(str(tmp_path / "nope.so"), ShimLayout(str(tmp_path)), ShimRegistry(lambda _: CgroupIdentity(
            Runtime.UNKNOWN)))


def test_directories_of_gone_pods_are_removed_after_the_grace_only(tmp_path: Path) -> None:
    clock = Clock()
    shim = backend(tmp_path / "state", clock)
    kept = shim.grant_extras(pod(), "main").mounts[2].host_path
    gone = shim.grant_extras(pod(UID2, "q"), "main").mounts[2].host_path
    live = {UID: ("ns", "p")}
    assert shim.sweep(live) == []
    clock.now = 119.0
    assert shim.sweep(None) == [] and shim.sweep(live) == []  # unknown listing: nothing removed
    clock.now = 121.0
    assert shim.sweep(live) == [(UID2, "main")]
    assert os.path.isdir(kept) and not os.path.exists(gone)
    assert [k for k in shim.registry.containers()] == [(UID, "main")]


def test_a_pod_listed_again_within_the_grace_keeps_its_directory(tmp_path: Path) -> None:
    clock = Clock()
    shim = backend(tmp_path / "state", clock)
    path = shim.grant_extras(pod(), "main").mounts[2].host_path
    shim.sweep({})
    clock.now = 100.0
    shim.sweep({UID: ("ns", "p")})
    clock.now = 200.0
    assert shim.sweep({}) == [] and os.path.isdir(path)


def test_after_a_restart_running_containers_still_register_with_the_same_token(tmp_path: Path) -> None:
    state = tmp_path / "state"
    token = backend(state).grant_extras(pod(), "main").envs[env.SHIM_TOKEN]
    restarted = backend(state)  # a new agent: nothing in memory, the same state directory
    assert restarted.registry.owner(token) is not None
    assert restarted.grant_extras(pod(), "main").envs[env.SHIM_TOKEN] == token

    async def main() -> bytes:
        with tempfile.TemporaryDirectory(prefix="gs", dir="/tmp") as short:
            restarted.server.path = os.path.join(short, "agent.sock")
            await restarted.server.start()
            try:
                request = encode_request(RegisterRequest(token, 1, "ns/p", "main"))
                return await asyncio.to_thread(exchange, restarted.server.path, request)
            finally:
                await restarted.server.stop()
    assert decode_reply(asyncio.run(main())).ok


def test_nothing_is_removed_while_the_listing_is_unknown(tmp_path: Path) -> None:
    """A PodResources outage or an unreadable listed pod must not look like every pod being gone."""
    clock = Clock()
    shim = backend(tmp_path / "state", clock)
    path = shim.grant_extras(pod(), "main").mounts[2].host_path
    shim.sweep({})
    clock.now = 500.0
    assert shim.sweep(None) == [] and os.path.isdir(path)
    assert shim.sweep({}) == [(UID, "main")]


def test_the_library_is_copied_to_a_host_path_and_replaced_when_it_changes(tmp_path: Path) -> None:
    """The path `gpupool shim path` prints is inside the agent's image on a DaemonSet; the runtime
    mounts from the host, so the grant names the copy under the state directory."""
    shim = backend(tmp_path / "state")
    copy = Path(shim.library)
    assert copy == tmp_path / "state" / "shim" / "libgpupool-shim.so"
    assert copy.read_bytes() == b"\x7fELF" and os.access(copy, os.X_OK)
    inode = copy.stat().st_ino
    backend(tmp_path / "state")  # the same library: the copy is left alone
    assert copy.stat().st_ino == inode
    (tmp_path / "libgpupool-shim.so").write_bytes(b"\x7fELF v2")
    ShimEnforcement(str(tmp_path / "libgpupool-shim.so"), ShimLayout(str(tmp_path / "state")),
                    ShimRegistry(lambda _: CgroupIdentity(Runtime.UNKNOWN)))
    assert copy.read_bytes() == b"\x7fELF v2" and copy.stat().st_ino != inode


def test_the_library_reads_the_grant_where_the_agent_mounts_it() -> None:
    """The path is compiled into the library (never from the environment): both sides must agree."""
    from gpupool.api.shim_contract import CONTAINER_GRANT_PATH
    from gpupool.shim.build import SOURCE_DIR

    source = (SOURCE_DIR / "grant.c").read_text()
    assert f'#define SHIM_GRANT_PATH "{CONTAINER_GRANT_PATH}"' in source
