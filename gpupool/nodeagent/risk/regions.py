"""Read what each container's accounting region says it holds per card, for the tamper check.

The region (``<state>/containers/<pod-uid>_<container>/memory.region``, the library's layout read
by :func:`gpupool.shim.region.read_region`) keeps per CUDA ordinal the bytes the container's
processes charged; ordinal ``i`` is the container's ``i``-th slice of its assignment, the order the
grant file lists its limits in (:func:`gpupool.nodeagent.isolation.shim_grant.node_grant`), so the
figures come back by card index.

A file that is not a region any more (zeroed or truncated from inside: the container can write it)
says the container holds nothing: that is what the library would go on from. A file that cannot be
read at all (removed by the agent's sweep, a permission problem) says nothing, and nothing is judged
on it; each distinct problem is logged once. Reads are lazy (only for a container whose registered
processes hold more than their driver overhead) and at most once per round.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from gpupool.api.shim_contract import REGION_FILE
from gpupool.nodeagent.isolation.shim_files import ShimFileError, ShimLayout
from gpupool.nodeagent.risk.detector import ContainerName, RegionUse
from gpupool.nodeagent.types import PodView
from gpupool.shim.region import RegionFormatError, RegionSnapshot, read_region

log = logging.getLogger(__name__)

MIB = 1024 * 1024

RegionRead = Callable[[Path], RegionSnapshot]


class RegionReader:
    """The regions under the agent's state directory (``--state-dir``), as the library writes them."""

    def __init__(self, state_dir: str, read: RegionRead = read_region) -> None:
        self.layout = ShimLayout(state_dir)
        self._read = read
        self._reported: set[tuple[str, str]] = set()

    def for_pods(self, pods: Iterable[PodView]) -> RegionUse:
        """A :data:`~gpupool.nodeagent.risk.detector.RegionUse` over these pods, each region read once."""
        slices: dict[ContainerName, tuple[str, tuple[int, ...]]] = {}
        for pod in pods:
            if pod.terminated or pod.assignment is None:
                continue
            for assignment in pod.assignment.placement.containers:
                slices[(pod.namespace, pod.name, assignment.container)] = (
                    pod.uid, tuple(piece.card for piece in assignment.slices))
        read: dict[ContainerName, dict[int, int] | None] = {}

        def region_use(name: ContainerName) -> dict[int, int] | None:
            if name not in read:
                known = slices.get(name)
                read[name] = self.use(known[0], name[2], known[1]) if known is not None else None
            return read[name]

        return region_use

    def use(self, pod_uid: str, container: str, cards: tuple[int, ...]) -> dict[int, int] | None:
        """Card → MiB the container's region shows (ordinal ``i`` is ``cards[i]``); ``None`` when unreadable."""
        try:
            path = os.path.join(self.layout.container_dir(pod_uid, container), REGION_FILE)
        except ShimFileError as exc:
            self._report(f"{pod_uid}_{container}", "name", f"no region for {pod_uid}/{container}: {exc}")
            return None
        try:
            region = self._read(Path(path))
        except RegionFormatError as exc:
            self._report(path, "format", f"region {path} is not a region any more ({exc}): it accounts nothing")
            return dict.fromkeys(cards, 0)
        except OSError as exc:
            self._report(path, "read", f"region {path} unreadable ({exc}); its container's account is not checked")
            return None
        return {card: region.devices[ordinal].used_bytes // MIB
                for ordinal, card in enumerate(cards) if ordinal < len(region.devices)}

    def _report(self, where: str, what: str, message: str) -> None:
        if (where, what) not in self._reported:
            self._reported.add((where, what))
            log.warning("%s", message)
