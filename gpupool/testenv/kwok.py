"""KWOK: thousands of simulated nodes against the test environment's real control plane.

A kubelet per node does not scale on one machine (each is a process with its own runtime, ~100 MB
and a CPU share), and a bare Node object goes stale: nothing renews its Lease or heartbeat, so a
node lifecycle controller marks it unreachable after its grace period, and a pod bound to it stays
Pending forever. KWOK (``sigs.k8s.io/kwok``, pinned as :data:`~gpupool.testenv.versions.KWOK`) is
one process that plays the kubelet of every node it manages, through the apiserver only:

* a new node gets its conditions (Ready and the pressure conditions), addresses and node info,
  keeping the capacity and allocatable it was created with (stage ``node-initialize``);
* the node's Lease in ``kube-node-lease`` is renewed every quarter of its duration (40 s, as a
  kubelet's), and its status heartbeat rewritten every 10 to 20 minutes
  (``node-heartbeat-with-lease``), so the node stays Ready under a node lifecycle controller;
* a pod bound to a managed node becomes Running and Ready, with a pod IP from
  :data:`POD_CIDR` (``pod-ready``); a Job's pod completes (``pod-complete``); a deleted pod is
  removed at once (``pod-delete``).

Nothing runs: no container, no device plugin, no ``Allocate`` (a GPU pod's env is never
injected), no volumes, no probes, no logs or exec. Only the nodes that carry
:data:`MANAGED_ANNOTATION` are managed, so KWOK coexists with real kubelets and bare Node objects.

``kwok`` without kwokctl loads its stages only from ``--config`` (``kwokctl`` writes its defaults
into the cluster's config file; plain ``kwok`` with none exits "no stages found"), so
:func:`start_kwok` writes one file with the default stages kwokctl would choose for a cluster
with node leases, read from the pinned module's ``kustomize/stage`` directory, and a
``KwokConfiguration`` with every option set (a configuration read from a file gets no defaults).
``KWOK_WORKDIR`` points into the run's state directory, so a developer's ``~/.kwok/kwok.yaml`` is
never loaded.

Built like every Go program here (:mod:`gpupool.testenv.gobuild`): a wrapper module requiring
``sigs.k8s.io/kwok`` at the pin (its ``go`` line and any ``replace`` it names that a dependency's
``go.mod`` cannot carry), so its own ``k8s.io`` client libraries (v0.36 at v0.8.0; client-go
talks to apiservers a minor older or newer) are the ones built; under its own lock, so it never
waits behind a Kubernetes build.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpupool.testenv.errors import BuildFailedError
from gpupool.testenv.gobuild import (
    GoBuild,
    GoProgram,
    build,
    ensure_built,
    go_env,
    module_dir,
    toolchain_problem,
    wrapper_go_mod,
)
from gpupool.testenv.healthz_start import start_with_healthz
from gpupool.testenv.procs import ManagedProcess, spawn
from gpupool.testenv.steps import Log, exclusive_lock, quiet
from gpupool.testenv.versions import KWOK

if TYPE_CHECKING:
    from gpupool.testenv.controlplane import ControlPlane

__all__ = ["MANAGED_ANNOTATION", "KwokInstall", "KwokOptions", "ensure_kwok", "kwok_args", "kwok_build",
           "kwok_go_mod", "managed_node", "render_kwok_config", "start_kwok"]

KWOK_MODULE = "sigs.k8s.io/kwok"
KWOK_COMMAND = "kwok"

#: KWOK's build takes its own lock, so it never waits behind a Kubernetes or runtime build.
BUILD_LOCK = ".kwok-build.lock"

#: The annotation that hands a node to KWOK (kwokctl's convention); others are left alone.
MANAGED_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

#: The default stages kwokctl writes for a cluster with node leases, in the pinned module.
STAGE_FILES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)

#: Pod IPs of running pods (KWOK's default, ``10.0.0.0/24``, would overlap the service range and
#: hold 254 pods).
POD_CIDR = "10.244.0.0/16"

_GO_DIRECTIVE = re.compile(r"^go\s+(\S+)\s*$", re.MULTILINE)
_REPLACE_BLOCK = re.compile(r"^replace\s*\(\s*\n(.*?)^\)", re.MULTILINE | re.DOTALL)
_REPLACE_LINE = re.compile(r"^replace\s+(?!\()(.+)$", re.MULTILINE)


@dataclass(frozen=True)
class KwokOptions:
    """What a KWOK run is tuned with (``KwokConfiguration.options``; flags carry the rest).

    ``lease_duration_s`` is what a kubelet sets (40 s, renewed every 10 s; 0: no Leases, status
    heartbeats only). Each ``*_parallelism`` is a number of workers: KWOK's default (4) keeps up
    with the Leases of 5,000 nodes (500 renewals/s) only on an idle machine.
    """

    lease_duration_s: int = 40
    lease_parallelism: int = 16
    node_parallelism: int = 8
    pod_parallelism: int = 8
    pods_on_node_parallelism: int = 4
    pod_cidr: str = POD_CIDR


@dataclass(frozen=True)
class KwokInstall:
    """The built ``kwok`` and the source of its pinned module (the stage files)."""

    binary: Path
    source: Path

    def stages(self) -> list[str]:
        """The text of each default stage (:data:`STAGE_FILES`)."""
        return [(self.source / relative).read_text() for relative in STAGE_FILES]


def kwok_go_mod(kwok_mod: str) -> str:
    """The wrapper ``go.mod`` from KWOK's own: its ``go`` line and every ``replace`` that points at a
    module version (a dependency's replaces do not apply to the module that requires it).

    A replace by a local directory cannot be carried over: :class:`BuildFailedError` names it.
    """
    replaces: list[tuple[str, str, str]] = []
    lines = [line for block in _REPLACE_BLOCK.findall(kwok_mod) for line in block.splitlines()]
    lines += _REPLACE_LINE.findall(kwok_mod)
    for line in (raw.split("//", 1)[0].strip() for raw in lines):
        if not line:
            continue
        old, _, new = (part.strip() for part in line.partition("=>"))
        target = new.split()
        if len(target) != 2:
            raise BuildFailedError(f"{KWOK_MODULE} {KWOK}: its go.mod replaces {old} by a local directory "
                                   f"({new}); the wrapper module cannot carry that")
        replaces.append((old.split()[0], target[0], target[1]))
    go_match = _GO_DIRECTIVE.search(kwok_mod)
    return wrapper_go_mod([(KWOK_MODULE, KWOK)], replaces=replaces, go=go_match.group(1) if go_match else "1.26.0")


def kwok_build(kwok_mod: str) -> GoBuild:
    """``kwok`` (``cmd/kwok``), one cache entry ``kwok-<pin>``."""
    return GoBuild(key=f"kwok-{KWOK}", go_mod=kwok_go_mod(kwok_mod),
                   programs=(GoProgram(KWOK_COMMAND, f"{KWOK_MODULE}/cmd/{KWOK_COMMAND}"),))


def _cached_source() -> tuple[Path, Path]:
    """Where the module cache keeps KWOK's extracted source and its ``go.mod`` once downloaded."""
    mod_cache = Path(go_env()["GOMODCACHE"])
    return (mod_cache / f"{KWOK_MODULE}@{KWOK}",
            mod_cache / "cache" / "download" / KWOK_MODULE / "@v" / f"{KWOK}.mod")


def cached_kwok() -> KwokInstall | None:
    """The built KWOK if its cache entry is complete and its source is in the module cache (a few
    ``stat`` calls and two small reads), else ``None``."""
    source, mod_file = _cached_source()
    try:
        spec = kwok_build(mod_file.read_text())
    except OSError:
        return None
    if not (spec.is_built() and all((source / f).is_file() for f in STAGE_FILES)):
        return None
    return KwokInstall(binary=spec.paths()[KWOK_COMMAND], source=source)


def ensure_kwok(log: Log = quiet) -> KwokInstall:
    """KWOK, built first if the cache lacks it (a cold build takes minutes).

    Raises :class:`BuildImpossibleError` (no Go, no module proxy) or :class:`BuildFailedError`
    (a build step failed; the message names its log).
    """
    def make(logs: Path) -> None:
        source = module_dir(KWOK_MODULE, KWOK, logs=logs, log=log)
        build(kwok_build((source / "go.mod").read_text()), logs=logs, log=log)

    found = ensure_built(cached_kwok, make, what=f"{KWOK_MODULE} {KWOK} (binary and stage files)",
                         lock_name=BUILD_LOCK, problem=toolchain_problem, lock=exclusive_lock, log=log)
    log(f"KWOK {KWOK} ready")
    return found


def render_kwok_config(stages: Sequence[str], options: KwokOptions = KwokOptions()) -> str:
    """The file ``--config`` names: a ``KwokConfiguration`` with every option KWOK defaults
    when it has no file (a file's configuration is not defaulted: an option left out is zero), then
    the stages, one YAML document each."""
    configuration: dict[str, Any] = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
        "metadata": {"name": "gpupool-testenv"},
        "options": {
            "cidr": options.pod_cidr,
            "manageAllNodes": False,
            "enableDebuggingHandlers": False,
            "enableContentionProfiling": False,
            "enableProfilingHandler": False,
            "nodeLeaseDurationSeconds": options.lease_duration_s,
            "nodeLeaseParallelism": options.lease_parallelism,
            "nodePlayStageParallelism": options.node_parallelism,
            "podPlayStageParallelism": options.pod_parallelism,
            "podsOnNodeSyncParallelism": options.pods_on_node_parallelism,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
        },
    }
    documents = [yaml.safe_dump(configuration, sort_keys=False).strip()]
    documents += [text.strip() for text in stages]
    return "\n---\n".join(documents) + "\n"


def kwok_args(*, kubeconfig: Path, config: Path, port: int, options: KwokOptions = KwokOptions(),
              annotation: tuple[str, str] = MANAGED_ANNOTATION) -> list[str]:
    """``kwok``'s flags (without the binary): the stages and options of ``config``, only the nodes
    annotated ``annotation``, health on ``http://127.0.0.1:<port>/healthz``."""
    key, value = annotation
    return [
        f"--kubeconfig={kubeconfig}", f"--config={config}",
        "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={key}={value}",
        f"--node-lease-duration-seconds={options.lease_duration_s}", f"--cidr={options.pod_cidr}",
        f"--server-address=127.0.0.1:{port}",
        "--v=WARN",  # INFO logs every patch and Lease renewal: 500 lines/s at 5,000 nodes
    ]


def managed_node(node: Mapping[str, Any], annotation: tuple[str, str] = MANAGED_ANNOTATION) -> dict[str, Any]:
    """``node`` (a Node manifest) with the annotation that hands it to KWOK, and without status
    conditions, so that KWOK's ``node-initialize`` stage makes it Ready (capacity and allocatable
    are kept)."""
    metadata = dict(node.get("metadata") or {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), annotation[0]: annotation[1]}
    status = {k: v for k, v in (node.get("status") or {}).items() if k != "conditions"}
    return {**node, "metadata": metadata, "status": status}


def start_kwok(plane: ControlPlane, *, options: KwokOptions = KwokOptions(), kubeconfig: Path | None = None,
               name: str = "kwok", install: KwokInstall | None = None, timeout: float = 60.0,
               log: Log = quiet) -> ManagedProcess:
    """Run KWOK against ``plane`` for the nodes annotated :data:`MANAGED_ANNOTATION`; returns once its
    controllers have started (``/healthz`` answers). The caller stops it (``.stop()``) before the
    plane.

    ``kubeconfig`` defaults to the admin one (``plane.audited_kubeconfig`` counts KWOK's requests).
    Config and log go under ``<state dir>/<name>/`` and ``<state dir>/logs/<name>.log``.
    """
    install = install or ensure_kwok(log)
    directory = plane.state_dir / name
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "kwok.yaml"
    config.write_text(render_kwok_config(install.stages(), options))
    env = {**os.environ, "KWOK_WORKDIR": str(directory)}

    def start(port: int) -> ManagedProcess:
        args = kwok_args(kubeconfig=kubeconfig or plane.kubeconfig, config=config, port=port, options=options)
        argv: list[str | Path] = [install.binary, *args]
        return spawn(name, argv, plane.state_dir / "logs" / f"{name}.log", cwd=directory, env=env)

    # the health port can be taken between picking and binding: a fresh port then
    return start_with_healthz(name, start, timeout, scheme="http")
