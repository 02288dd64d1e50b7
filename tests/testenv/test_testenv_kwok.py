"""Unit tests of the KWOK wiring (pure: the wrapper module, the config file, the flags, the cache;
``go build`` is replaced by a stand-in)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpupool.testenv import gobuild, kwok
from gpupool.testenv.errors import BuildFailedError
from gpupool.testenv.paths import CACHE_ENV, cache_dir
from gpupool.testenv.versions import KWOK

#: The shape of KWOK's own go.mod (v0.8.0 has no replace; a later pin might).
KWOK_MOD = """module sigs.k8s.io/kwok

go 1.26.0

require (
\tk8s.io/api v0.36.1
\tk8s.io/client-go v0.36.1
)
"""

STAGE = """apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: {name}
spec:
  resourceRef:
    apiGroup: v1
    kind: {kind}
"""


def test_the_wrapper_requires_the_pin_and_keeps_kwoks_go_line() -> None:
    text = kwok.kwok_go_mod(KWOK_MOD.replace("go 1.26.0", "go 1.26.3"))
    assert f"\tsigs.k8s.io/kwok {KWOK}\n" in text
    assert "\ngo 1.26.3\n" in text
    assert "replace" not in text
    # KWOK's own k8s.io requirements are left to the module (its go.mod is read by go itself)
    assert "k8s.io/api" not in text


def test_the_wrapper_carries_kwoks_replaces_of_module_versions() -> None:
    mod = KWOK_MOD + ("\nreplace (\n\tk8s.io/api => k8s.io/api v0.36.2 // a fix\n)\n"
                      "\nreplace github.com/a/b v1.0.0 => github.com/c/b v1.0.1\n")
    text = kwok.kwok_go_mod(mod)
    assert "\tk8s.io/api => k8s.io/api v0.36.2\n" in text
    assert "\tgithub.com/a/b => github.com/c/b v1.0.1\n" in text


def test_a_replace_by_a_local_directory_is_refused_naming_it() -> None:
    with pytest.raises(BuildFailedError, match=r"k8s\.io/api.*local directory"):
        kwok.kwok_go_mod(KWOK_MOD + "\nreplace k8s.io/api => ./staging/api\n")


def test_the_build_is_kwoks_command_in_an_entry_named_by_the_pin() -> None:
    spec = kwok.kwok_build(KWOK_MOD)
    assert spec.key == f"kwok-{KWOK}"
    assert [(p.name, p.package) for p in spec.programs] == [("kwok", "sigs.k8s.io/kwok/cmd/kwok")]
    assert not spec.cgo


def test_the_config_sets_every_option_then_lists_the_stages() -> None:
    stages = [STAGE.format(name="node-initialize", kind="Node"), STAGE.format(name="pod-ready", kind="Pod")]
    options = kwok.KwokOptions(lease_duration_s=40, lease_parallelism=16, pod_cidr="10.244.0.0/16")
    documents = list(yaml.safe_load_all(kwok.render_kwok_config(stages, options)))
    configuration, *rest = documents
    assert configuration["apiVersion"] == "config.kwok.x-k8s.io/v1alpha1"
    assert configuration["kind"] == "KwokConfiguration"
    opts = configuration["options"]
    # a configuration read from a file is not defaulted: no worker count may be left at zero
    for key in ("nodeLeaseParallelism", "nodePlayStageParallelism", "podPlayStageParallelism",
                "podsOnNodeSyncParallelism"):
        assert opts[key] >= 1, key
    assert opts["nodeLeaseDurationSeconds"] == 40 and opts["nodeLeaseParallelism"] == 16
    assert opts["cidr"] == "10.244.0.0/16" and opts["manageAllNodes"] is False
    assert opts["enablePodsOnNodeSyncListPager"] is True
    assert [(d["kind"], d["metadata"]["name"]) for d in rest] == [("Stage", "node-initialize"), ("Stage", "pod-ready")]


def test_the_default_stages_are_kwokctls_for_a_cluster_with_leases() -> None:
    names = [Path(f).stem for f in kwok.STAGE_FILES]
    assert names == ["node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-complete", "pod-delete"]


def test_kwok_manages_only_annotated_nodes_and_serves_health_on_loopback(tmp_path: Path) -> None:
    args = kwok.kwok_args(kubeconfig=tmp_path / "kubeconfig", config=tmp_path / "kwok.yaml", port=4321,
                          options=kwok.KwokOptions(lease_duration_s=40))
    assert f"--kubeconfig={tmp_path / 'kubeconfig'}" in args
    assert f"--config={tmp_path / 'kwok.yaml'}" in args
    assert "--manage-all-nodes=false" in args
    assert "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" in args
    assert "--node-lease-duration-seconds=40" in args
    assert "--server-address=127.0.0.1:4321" in args
    assert not any(a.startswith("--manage-single-node") for a in args)


def test_a_managed_node_carries_the_annotation_and_leaves_its_conditions_to_kwok() -> None:
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "annotations": {"gpupool.io/inventory-v1": "x"}},
            "status": {"allocatable": {"gpupool.io/gpu": "8"}, "capacity": {"gpupool.io/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    managed = kwok.managed_node(node)
    assert managed["metadata"]["annotations"] == {"gpupool.io/inventory-v1": "x", "kwok.x-k8s.io/node": "fake"}
    assert managed["status"] == {"allocatable": {"gpupool.io/gpu": "8"}, "capacity": {"gpupool.io/gpu": "8"}}
    assert "kwok.x-k8s.io/node" not in node["metadata"]["annotations"]  # the input is not changed
    assert node["status"]["conditions"]


@pytest.fixture
def fake_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gobuild, "toolchain_problem", lambda: None)
    monkeypatch.setattr(kwok, "toolchain_problem", lambda: None)
    monkeypatch.setattr(gobuild, "go_binary", lambda: Path("/usr/local/go/bin/go"))
    return tmp_path / "cache"


def _download(log_dir: Path) -> Path:
    """What ``go mod download`` leaves: the source (with the stage files) and the cached ``.mod``."""
    source, mod_file = kwok._cached_source()
    for relative in kwok.STAGE_FILES:
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_text(STAGE.format(name=Path(relative).stem, kind="Node"))
    (source / "go.mod").write_text(KWOK_MOD)
    mod_file.parent.mkdir(parents=True, exist_ok=True)
    mod_file.write_text(KWOK_MOD)
    return source


def test_a_build_fills_the_entry_under_its_own_lock_and_the_next_call_is_a_hit(
    fake_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []
    locks: list[Path] = []

    def go_build(cmd: list[str], log_path: Path, **_: object) -> None:
        commands.append(cmd)
        out = Path(cmd[cmd.index("-o") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("#!/bin/sh\n")
        out.chmod(0o755)

    real_lock = kwok.exclusive_lock

    def lock(path: Path, log: object) -> object:
        locks.append(path)
        return real_lock(path, lambda _m: None)

    monkeypatch.setattr(gobuild, "run_step", go_build)
    monkeypatch.setattr(kwok, "module_dir", lambda module, version, logs, log: _download(logs))
    monkeypatch.setattr(kwok, "exclusive_lock", lock)
    assert kwok.cached_kwok() is None
    install = kwok.ensure_kwok()
    assert install.binary == cache_dir() / f"kwok-{KWOK}" / "bin" / "kwok"
    assert [c[-1] for c in commands] == ["sigs.k8s.io/kwok/cmd/kwok"]
    assert locks == [cache_dir() / ".kwok-build.lock"]
    assert yaml.safe_load(install.stages()[0])["metadata"]["name"] == "node-initialize"
    commands.clear()
    assert kwok.ensure_kwok() == install and commands == [] and len(locks) == 1
