"""Resource and annotation names: re-exported from :mod:`gpupool.core.names`, their one home."""

from gpupool.core.names import (
    ALIAS_FAMILIES,
    ALIASES,
    ALIYUN_GPU_MEM,
    DEFAULT_DOMAIN,
    NVIDIA_GPUCORES,
    NVIDIA_GPUMEM,
    TENCENT_VCUDA_CORE,
    TENCENT_VCUDA_MEMORY,
    UNSERVABLE,
    ResourceNames,
    alias_family_resources,
)

__all__ = ["ALIASES", "ALIAS_FAMILIES", "ALIYUN_GPU_MEM", "DEFAULT_DOMAIN", "NVIDIA_GPUCORES", "NVIDIA_GPUMEM",
           "TENCENT_VCUDA_CORE", "TENCENT_VCUDA_MEMORY", "UNSERVABLE", "ResourceNames", "alias_family_resources"]
