"""Resource and annotation names under one configurable domain, plus the accepted foreign aliases.

It lives in the core (pure data, no I/O) because both the extender's adapters and the node-side
services must agree on every name, and services may not import adapters.

Why one object: the domain (``gpupool.io`` by default) is a deployment choice, and every module that
reads a pod or a node must agree on it. Passing a :class:`ResourceNames` around keeps that agreement
explicit instead of scattering string constants.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_DOMAIN = "gpupool.io"

#: Alibaba gpushare: GPU memory of one card, in GiB (the gpushare device plugin's default unit).
ALIYUN_GPU_MEM = "aliyun.com/gpu-mem"
#: Tencent GPUManager: compute in percent of a card (100 = one whole card, 200 = two whole cards).
TENCENT_VCUDA_CORE = "tencent.com/vcuda-core"
#: Tencent GPUManager: memory in units of 256 MiB.
TENCENT_VCUDA_MEMORY = "tencent.com/vcuda-memory"
#: HAMi: memory per card in MiB.
NVIDIA_GPUMEM = "nvidia.com/gpumem"
#: HAMi: compute per card in percent.
NVIDIA_GPUCORES = "nvidia.com/gpucores"

ALIASES: tuple[str, ...] = (ALIYUN_GPU_MEM, TENCENT_VCUDA_CORE, TENCENT_VCUDA_MEMORY, NVIDIA_GPUMEM,
                            NVIDIA_GPUCORES)

#: Foreign resource families the node agent can serve as kubelet devices (opt-in, per node:
#: ``gpupool node-agent --serve-aliases gpushare,gpumanager``), by the project an admin migrates from.
#: Their units are coarse enough to be kubelet devices (1 GiB, 256 MiB, 1 %), so kubelet's count
#: admission can follow the extender's booking exactly.
ALIAS_FAMILIES: dict[str, tuple[str, ...]] = {
    "gpushare": (ALIYUN_GPU_MEM,),
    "gpumanager": (TENCENT_VCUDA_CORE, TENCENT_VCUDA_MEMORY),
}

#: Why no node agent serves an alias: the extender's filter gives this reason instead of letting
#: kubelet silently drop the resource (kubelet ignores extended resources its node does not
#: advertise, so the container would start without any GPU grant).
UNSERVABLE: dict[str, str] = {
    name: ("HAMi's resources are not served by gpupool's node agent: nvidia.com/gpumem counts MiB, and a "
           "kubelet device per MiB (143,771 per H200 card) is more than kubelet's device plugin stream "
           "carries; HAMi's card count is nvidia.com/gpu, NVIDIA's whole-card resource. Ask for "
           "gpupool.io/gpu-mem (256 MiB units) and gpupool.io/gpu-core (percent) instead")
    for name in (NVIDIA_GPUMEM, NVIDIA_GPUCORES)
}


def alias_family_resources(families: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The foreign resources of the named families, in registration order; ``ValueError`` names
    an unknown family (and the known ones) so a typo in a DaemonSet's flags fails at start."""
    out: list[str] = []
    for family in families:
        if family not in ALIAS_FAMILIES:
            raise ValueError(f"unknown alias family {family!r}; known: {', '.join(ALIAS_FAMILIES)}")
        out.extend(r for r in ALIAS_FAMILIES[family] if r not in out)
    return tuple(out)


@dataclass(frozen=True)
class ResourceNames:
    """Every name the extender reads or writes, derived from one domain."""

    domain: str = DEFAULT_DOMAIN

    def __post_init__(self) -> None:
        if not self.domain or "/" in self.domain or " " in self.domain:
            raise ValueError(f"resource domain must be a DNS name such as gpupool.io, got {self.domain!r}")

    # ------------------------------------------------------------------ extended resources
    @property
    def gpu(self) -> str:
        """Whole exclusive cards (a count); one card is one kubelet device. Never part of a slice:
        kubelet would take whole-card devices for a shared slice and refuse pods the extender
        placed on cards that other slices share."""
        return f"{self.domain}/gpu"

    @property
    def gpu_shared(self) -> str:
        """How many cards a slice (``gpu-mem``/``gpu-core``) spans; 1 when absent. One kubelet
        device is one slice on one card; the node agent advertises more per card than a card can
        ever hold slices, so kubelet's count never refuses what the extender placed."""
        return f"{self.domain}/gpu-shared"

    @property
    def gpu_mem(self) -> str:
        """Memory per card in units of 256 MiB: one unit is one kubelet device of the node agent."""
        return f"{self.domain}/gpu-mem"

    @property
    def gpu_core(self) -> str:
        """Compute per card in percent (100 = the whole card); one percent is one kubelet device."""
        return f"{self.domain}/gpu-core"

    def all(self) -> tuple[str, str, str, str]:
        """gpupool's own resources, in the order the device plugin registers them."""
        return (self.gpu, self.gpu_mem, self.gpu_core, self.gpu_shared)

    def managed(self) -> tuple[str, ...]:
        """Every resource name the extender owns (for ``managedResources`` and quick pod checks)."""
        return (*self.all(), *ALIASES)

    # ------------------------------------------------------------------------- annotations
    @property
    def inventory(self) -> str:
        """Node annotation: the per-card inventory published by the node side (JSON, versioned)."""
        return f"{self.domain}/inventory-v1"

    @property
    def assignment(self) -> str:
        """Pod annotation: the cards the extender chose at bind time (JSON, versioned)."""
        return f"{self.domain}/assignment-v1"

    @property
    def allocated(self) -> str:
        """Pod annotation written by the node side once Allocate handed the cards to the pod."""
        return f"{self.domain}/allocated-v1"

    @property
    def gpu_models(self) -> str:
        """Pod annotation: comma-separated allowed GPU models (empty or absent = any)."""
        return f"{self.domain}/gpu-models"

    @property
    def exclusive(self) -> str:
        """Pod annotation ``"true"``: every GPU container takes whole cards, closed to sharing."""
        return f"{self.domain}/exclusive"

    @property
    def model_label(self) -> str:
        """Node label: the cards' model as the node side publishes it (for node selectors)."""
        return f"{self.domain}/gpu-model"
