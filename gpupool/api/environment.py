"""The container environment contract: the variables Allocate sets for a container with a share.

Every consumer inside the container (the NVIDIA container runtime, CUDA MPS, gpupool's own
enforcement and usage attribution) reads its limits from here, so the names and their formats are
part of gpupool's contract, versioned by ``GPUPOOL_ENV_VERSION``. Per-card values are
comma-separated, in the order the scheduler exposed the cards to the container (ordinal 0 first).

* ``NVIDIA_VISIBLE_DEVICES``: card UUIDs (read by the NVIDIA container runtime);
* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``0=4096M,1=4096M`` (ordinal within the container);
* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the smallest per-card compute share, in percent (MPS takes
  one value per client); a container without any compute share (memory-only slices, gpushare's
  meaning: compute is shared best-effort) gets 100, not 0;
* ``GPUPOOL_MEMORY_LIMIT_MIB`` / ``GPUPOOL_COMPUTE_PERCENT`` / ``GPUPOOL_CARD_INDICES`` /
  ``GPUPOOL_CARD_UUIDS``: the same per card for gpupool's own enforcement (0 % = no compute limit);
* ``GPUPOOL_POD`` / ``GPUPOOL_CONTAINER``: whose share this is, so a mix-up is visible in logs and
  usage can be attributed.

Optional variables (:data:`OPTIONAL`), set only where the node enforces shares with a backend that
needs them; a reader must not require them, which is why adding them kept version ``1``:

* ``GPUPOOL_SHIM_DIR`` / ``GPUPOOL_AGENT_SOCKET`` / ``GPUPOOL_SHIM_TOKEN`` / ``GPUPOOL_COMPUTE_MODE``:
  the interception library's per-container directory, the node agent's registration socket, the
  container's registration token and ``hard`` or ``soft`` compute limiting (paths and the
  registration protocol: :mod:`gpupool.api.shim_contract`);
* ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``: where the node's MPS control daemon
  listens, as mounted into the container.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: Bumped when a variable changes meaning; readers refuse a version they do not know.
ENV_VERSION = "1"

VERSION = "GPUPOOL_ENV_VERSION"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
MPS_PINNED_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MEMORY_LIMIT_MIB = "GPUPOOL_MEMORY_LIMIT_MIB"
COMPUTE_PERCENT = "GPUPOOL_COMPUTE_PERCENT"
CARD_INDICES = "GPUPOOL_CARD_INDICES"
CARD_UUIDS = "GPUPOOL_CARD_UUIDS"
POD = "GPUPOOL_POD"
CONTAINER = "GPUPOOL_CONTAINER"

SHIM_DIR = "GPUPOOL_SHIM_DIR"
AGENT_SOCKET = "GPUPOOL_AGENT_SOCKET"
SHIM_TOKEN = "GPUPOOL_SHIM_TOKEN"
COMPUTE_MODE = "GPUPOOL_COMPUTE_MODE"
MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
MPS_LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"

#: Every variable a reader requires, in the order Allocate writes them.
ALL = (VERSION, NVIDIA_VISIBLE_DEVICES, MPS_PINNED_MEMORY, MPS_THREAD_PERCENTAGE, MEMORY_LIMIT_MIB,
       COMPUTE_PERCENT, CARD_INDICES, CARD_UUIDS, POD, CONTAINER)

#: Variables set only by some enforcement backends; readers take them when present.
OPTIONAL = (SHIM_DIR, AGENT_SOCKET, SHIM_TOKEN, COMPUTE_MODE, MPS_PIPE_DIRECTORY, MPS_LOG_DIRECTORY)

#: ``GPUPOOL_COMPUTE_MODE`` values: ``hard`` never lets a container above its compute share, ``soft``
#: lets it use more while the card has idle capacity; absent means ``hard``.
COMPUTE_MODE_HARD = "hard"
COMPUTE_MODE_SOFT = "soft"
COMPUTE_MODES = (COMPUTE_MODE_HARD, COMPUTE_MODE_SOFT)

#: MPS's value for "no limit": a container whose slices carry no compute share.
UNLIMITED_PERCENT = 100


class EnvContractError(ValueError):
    """The environment does not follow the contract (missing variable, bad number, other version)."""


@dataclass(frozen=True)
class CardShare:
    """One card of a container's share: which card, and the limits on it."""

    index: int
    uuid: str
    memory_mib: int
    compute_percent: int  # 0: no compute limit on this card


@dataclass(frozen=True)
class ContainerEnvironment:
    """The share of one container, as written into and read back from its environment."""

    pod: str  # "namespace/name"
    container: str
    cards: tuple[CardShare, ...]

    def to_env(self) -> dict[str, str]:
        """The variables Allocate returns for this container."""
        limited = [c.compute_percent for c in self.cards if c.compute_percent > 0]
        return {
            VERSION: ENV_VERSION,
            NVIDIA_VISIBLE_DEVICES: _join(c.uuid for c in self.cards),
            MPS_PINNED_MEMORY: _join(f"{i}={c.memory_mib}M" for i, c in enumerate(self.cards)),
            MPS_THREAD_PERCENTAGE: str(min(limited) if limited else UNLIMITED_PERCENT),
            MEMORY_LIMIT_MIB: _join(str(c.memory_mib) for c in self.cards),
            COMPUTE_PERCENT: _join(str(c.compute_percent) for c in self.cards),
            CARD_INDICES: _join(str(c.index) for c in self.cards),
            CARD_UUIDS: _join(c.uuid for c in self.cards),
            POD: self.pod,
            CONTAINER: self.container,
        }

    @staticmethod
    def from_env(env: Mapping[str, str]) -> ContainerEnvironment:
        """Read a container's share back (the monitor and the enforcement side use this)."""
        version = env.get(VERSION)
        if version != ENV_VERSION:
            raise EnvContractError(f"{VERSION}={version!r}: this reader knows version {ENV_VERSION}")
        missing = [k for k in ALL if k not in env]
        if missing:
            raise EnvContractError(f"missing {', '.join(missing)}")
        indices = _ints(env, CARD_INDICES)
        uuids = _split(env[CARD_UUIDS])
        memory = _ints(env, MEMORY_LIMIT_MIB)
        compute = _ints(env, COMPUTE_PERCENT)
        if not len(indices) == len(uuids) == len(memory) == len(compute):
            raise EnvContractError(f"{CARD_INDICES}, {CARD_UUIDS}, {MEMORY_LIMIT_MIB} and {COMPUTE_PERCENT}"
                                    " name different numbers of cards")
        if any(p > 100 for p in compute):
            raise EnvContractError(f"{COMPUTE_PERCENT}: a share above 100 percent")
        cards = tuple(CardShare(i, u, m, c) for i, u, m, c in zip(indices, uuids, memory, compute, strict=True))
        return ContainerEnvironment(pod=env[POD], container=env[CONTAINER], cards=cards)


def compute_mode(env: Mapping[str, str]) -> str:
    """``GPUPOOL_COMPUTE_MODE`` of an environment: ``hard`` when absent, an error when unknown."""
    mode = env.get(COMPUTE_MODE, COMPUTE_MODE_HARD)
    if mode not in COMPUTE_MODES:
        raise EnvContractError(f"{COMPUTE_MODE}={mode!r}: expected one of {', '.join(COMPUTE_MODES)}")
    return mode


def _join(parts: Iterable[str]) -> str:
    return ",".join(parts)


def _split(text: str) -> list[str]:
    return text.split(",") if text else []


def _ints(env: Mapping[str, str], key: str) -> list[int]:
    values = []
    for part in _split(env[key]):
        if not part.isdigit() or len(part) > 12:
            raise EnvContractError(f"{key}: {part!r} is not a non-negative integer")
        values.append(int(part))
    return values
