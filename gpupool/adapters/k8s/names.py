"""Resource and annotation names: re-exported from :mod:`gpupool.core.names`, their one home."""

from gpupool.core.names import (
    ALIASES,
    ALIYUN_GPU_MEM,
    DEFAULT_DOMAIN,
    NVIDIA_GPUCORES,
    NVIDIA_GPUMEM,
    TENCENT_VCUDA_CORE,
    TENCENT_VCUDA_MEMORY,
    ResourceNames,
)

__all__ = ["ALIASES", "ALIYUN_GPU_MEM", "DEFAULT_DOMAIN", "NVIDIA_GPUCORES", "NVIDIA_GPUMEM",
           "TENCENT_VCUDA_CORE", "TENCENT_VCUDA_MEMORY", "ResourceNames"]
