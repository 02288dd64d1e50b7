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
        """Whole cards (a count)."""
        return f"{self.domain}/gpu"

    @property
    def gpu_mem(self) -> str:
        """Memory per card in units of 256 MiB: one unit is one kubelet device of the node agent."""
        return f"{self.domain}/gpu-mem"

    @property
    def gpu_core(self) -> str:
        """Compute per card in percent (100 = the whole card); one percent is one kubelet device."""
        return f"{self.domain}/gpu-core"

    def all(self) -> tuple[str, str, str]:
        """gpupool's own resources, in the order the device plugin registers them."""
        return (self.gpu, self.gpu_mem, self.gpu_core)

    def managed(self) -> tuple[str, ...]:
        """Every resource name the extender owns (for ``managedResources`` and quick pod checks)."""
        return (self.gpu, self.gpu_mem, self.gpu_core, *ALIASES)

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

    def annotation(self, name: str) -> str:
        """A versioned annotation/label key under the domain (``gpupool.io/allocated-v1``)."""
        return f"{self.domain}/{name}"
