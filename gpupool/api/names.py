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

#: Alibaba gpushare: GPU memory of one card, in GiB (the gpushare device plugin's default unit; MiB
#: where its plugin ran with ``--memory-unit=MiB``: :attr:`ResourceNames.gpushare_unit_mib`).
ALIYUN_GPU_MEM = "aliyun.com/gpu-mem"
#: Alibaba cGPU: pod *label* spreading the pod's ``aliyun.com/gpu-mem`` over that many cards.
ALIYUN_GPU_COUNT = "aliyun.com/gpu-count"
#: Tencent GPUManager: compute in percent of a card (100 = one whole card, 200 = two whole cards).
TENCENT_VCUDA_CORE = "tencent.com/vcuda-core"
#: Tencent GPUManager: memory in units of 256 MiB.
TENCENT_VCUDA_MEMORY = "tencent.com/vcuda-memory"
#: HAMi: how many cards (NVIDIA's whole-card resource, which HAMi's device plugin serves split).
NVIDIA_GPU = "nvidia.com/gpu"
#: HAMi: memory per card in MiB.
NVIDIA_GPUMEM = "nvidia.com/gpumem"
#: HAMi: memory per card in percent of the card's memory.
NVIDIA_GPUMEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
#: HAMi: compute per card in percent.
NVIDIA_GPUCORES = "nvidia.com/gpucores"
#: HAMi: the task's priority when cards are time-shared (0 high, 1 low); not a scheduling priority.
NVIDIA_PRIORITY = "nvidia.com/priority"

HAMI_NAMES: tuple[str, ...] = (NVIDIA_GPU, NVIDIA_GPUMEM, NVIDIA_GPUMEM_PERCENTAGE, NVIDIA_GPUCORES,
                               NVIDIA_PRIORITY)

#: Foreign names the extender always reads. ``nvidia.com/gpu`` is not among them: many clusters give
#: it to NVIDIA's own device plugin, so gpupool reads it only beside HAMi's other names, or alone
#: when the deployment says it is HAMi's (:attr:`ResourceNames.hami`).
ALIASES: tuple[str, ...] = (ALIYUN_GPU_MEM, TENCENT_VCUDA_CORE, TENCENT_VCUDA_MEMORY, NVIDIA_GPUMEM,
                            NVIDIA_GPUMEM_PERCENTAGE, NVIDIA_GPUCORES, NVIDIA_PRIORITY)

#: Names no node advertises to kubelet, each with the resource kubelet calls the device plugin for
#: instead. HAMi's memory counts MiB: a kubelet device per MiB (143,771 per H200 card) is more than
#: the device plugin stream carries, so, as under HAMi, kubelet sees only the card count
#: ``nvidia.com/gpu`` and drops the others from an app container's admission (they are not in the
#: node's allocatable); the extender books them and Allocate for the card count hands the grant.
CARRIED_BY: dict[str, str] = {name: NVIDIA_GPU for name in HAMI_NAMES if name != NVIDIA_GPU}

#: The family of HAMi's names; the cluster setting ``hami`` (:mod:`gpupool.api.cluster_settings`).
HAMI_FAMILY = "hami"
#: Foreign resource families the node agent can serve as kubelet devices (opt-in, per node:
#: ``gpupool node-agent --serve-aliases gpushare,gpumanager``; ``hami`` by ``--hami``), by the project an admin migrates
#: from. Each device stands for a unit the extender books (1 GiB, 256 MiB, 1 %, one slice), so
#: kubelet's count admission never refuses what the extender placed (docs/node-agent.md).
ALIAS_FAMILIES: dict[str, tuple[str, ...]] = {
    "gpushare": (ALIYUN_GPU_MEM,),
    "gpumanager": (TENCENT_VCUDA_CORE, TENCENT_VCUDA_MEMORY),
    HAMI_FAMILY: (NVIDIA_GPU,),
}

#: Why a node cannot take a pod: the names below, asked for without ``nvidia.com/gpu`` beside them
#: in a container, are served by no node (kubelet would call no device plugin for the container,
#: which would start without its GPU grant); :func:`gpupool.kube.translate.foreign_resources` reports
#: them as wanted and the extender's filter gives this reason on every node.
UNSERVABLE: dict[str, str] = {
    name: (f"{name} needs {NVIDIA_GPU} beside it in the container: kubelet hands GPUs to a container only "
           f"for {NVIDIA_GPU} (HAMi's admission webhook added {NVIDIA_GPU}: 1; gpupool has none). Add "
           f"{NVIDIA_GPU}: 1, and run the node agents with --hami")
    for name in CARRIED_BY
}

#: Every foreign name a node agent may advertise (what the extender looks for in a node's allocatable).
SERVABLE: tuple[str, ...] = tuple(name for family in ALIAS_FAMILIES.values() for name in family)

#: HAMi's per-pod annotations (pod metadata), read as HAMi documents them.
HAMI_NODE_POLICY = "hami.io/node-scheduler-policy"
HAMI_GPU_POLICY = "hami.io/gpu-scheduler-policy"
HAMI_USE_GPUTYPE = "nvidia.com/use-gputype"
HAMI_NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
HAMI_USE_GPUUUID = "nvidia.com/use-gpuuuid"
HAMI_NOUSE_GPUUUID = "nvidia.com/nouse-gpuuuid"
HAMI_VGPU_MODE = "nvidia.com/vgpu-mode"

GIB_MIB = 1024
#: The units gpushare clusters used for ``aliyun.com/gpu-mem``, by name (``--gpushare-memory-unit``).
GPUSHARE_UNITS: dict[str, int] = {"GiB": GIB_MIB, "MiB": 1}


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
    hami: bool = False
    """``nvidia.com/gpu`` alone is HAMi's (whole cards gpupool schedules), not NVIDIA's plugin's."""
    gpushare_unit_mib: int = GIB_MIB
    """What one ``aliyun.com/gpu-mem`` is: 1024 (GiB, gpushare's default) or 1 (its MiB mode)."""

    def __post_init__(self) -> None:
        if not self.domain or "/" in self.domain or " " in self.domain:
            raise ValueError(f"resource domain must be a DNS name such as gpupool.io, got {self.domain!r}")
        if self.gpushare_unit_mib not in GPUSHARE_UNITS.values():
            raise ValueError(f"gpushare memory unit must be one of {', '.join(GPUSHARE_UNITS)}")

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
        return (*self.all(), *ALIASES, *((NVIDIA_GPU,) if self.hami else ()))

    def readable(self) -> tuple[str, ...]:
        """What a container's limits are read for: the managed names and HAMi's card count, which
        counts cards beside HAMi's other names even where it alone is not gpupool's."""
        return self.managed() if self.hami else (*self.managed(), NVIDIA_GPU)

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
    def virtual_cards(self) -> str:
        """Pod annotation ``shared`` or ``exclusive``: a slice of n cards (``gpu-shared: n``) may be
        served by one card presented as n devices (seed 003's virtual cards, in that mode)."""
        return f"{self.domain}/virtual-cards"

    @property
    def gpu_kind(self) -> str:
        """Pod annotation ``physical`` or ``virtual``: only cards of that kind (vGPU/MIG are virtual)."""
        return f"{self.domain}/gpu-kind"

    @property
    def node_policy(self) -> str:
        """Pod annotation ``binpack`` or ``spread``: how to choose this pod's node."""
        return f"{self.domain}/node-policy"

    @property
    def gpu_policy(self) -> str:
        """Pod annotation ``binpack`` or ``spread``: how to choose the card of this pod's slices."""
        return f"{self.domain}/gpu-policy"

    @property
    def enforcement(self) -> str:
        """Node annotation: which backend enforces the node's GPU shares and whether it takes shares
        at all (:mod:`gpupool.api.enforcement`), written by the node side with the inventory."""
        return f"{self.domain}/enforcement-v1"

    @property
    def model_label(self) -> str:
        """Node label: the cards' model as the node side publishes it (for node selectors)."""
        return f"{self.domain}/gpu-model"

    @property
    def remote_gpu(self) -> str:
        """Pod annotation ``"true"``: the pod's one GPU slice may be booked on a card of another node
        and reached over the network (docs/remote-gpu.md, "Scheduling a remote share")."""
        return f"{self.domain}/remote-gpu"

    @property
    def remote_share(self) -> str:
        """Pod annotation written at bind: the node and card a remote share is booked on
        (:mod:`gpupool.api.remote_share`, JSON, versioned)."""
        return f"{self.domain}/remote-share-v1"

    @property
    def wait_for_nodes(self) -> str:
        """Pod annotation ``"true"``: admission does not refuse the pod for asking more than every
        card of the cluster holds now (it waits for nodes still to come, e.g. from an autoscaler)."""
        return f"{self.domain}/wait-for-nodes"
