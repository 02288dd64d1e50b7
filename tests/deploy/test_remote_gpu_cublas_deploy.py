"""How a GPU node's agent gets NVIDIA's cuBLAS (docs/remote-gpu.md, "cuBLAS"), outside the chart
(tests/deploy/test_helm_chart.py has nodeAgent.remoteGpu.cublas.hostPath):

* the image's opt-in wheel: `--build-arg REMOTE_GPU_CUBLAS=1` installs the pinned nvidia-cublas-cu12
  into the prefix the runtime stage copies into its Python, where `gpupool remote-gpu serve` looks
  for it; off by default. The image is not built here: the Dockerfile's text is checked, the lookup
  against the wheel's layout in tests/remote/test_cublas_lookup.py;
* kustomize: the patch example in components/remote-gpu's kustomization comments, applied in an
  overlay, gives the agent what the chart's value gives it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import helm_render, kustomize_render

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "deploy" / "kustomize" / "components" / "remote-gpu"
HOST_DIR = "/usr/local/cuda-12.6/lib64"
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def build_stage() -> str:
    return DOCKERFILE.split("\nFROM ", 2)[1]


def test_the_wheel_is_installed_only_when_asked_into_the_prefix_the_runtime_copies() -> None:
    stage = build_stage()
    assert re.search(r"^ARG REMOTE_GPU_CUBLAS=0$", stage, re.M), "off by default"
    (step,) = re.findall(r'^RUN if \[ "\$REMOTE_GPU_CUBLAS" = 1 \]; then \\\n(.*?)\n *fi$', stage, re.M | re.S)
    assert re.fullmatch(r'\s*pip install --prefix=/install "nvidia-cublas-cu12==\$\{NVIDIA_CUBLAS_VERSION\}"; \\',
                        step), step
    assert re.search(r"^COPY --from=build /install /usr/local$", DOCKERFILE, re.M)
    # before the sources: a code change does not download the wheel again
    assert stage.index("nvidia-cublas-cu12") < stage.index("COPY gpupool ./gpupool")


def test_the_pin_is_one_exact_cuda_12_release_and_the_docs_name_it() -> None:
    (version,) = re.findall(r"^ARG NVIDIA_CUBLAS_VERSION=(\S+)$", build_stage(), re.M)
    assert re.fullmatch(r"12\.\d+\.\d+\.\d+", version), version
    docs = (ROOT / "docs" / "remote-gpu.md").read_text()
    assert f"nvidia-cublas-cu12=={version}" in docs
    assert "--build-arg REMOTE_GPU_CUBLAS=1" in docs


def commented_example() -> dict[str, Any]:
    """The patch example of the component's comments, as YAML."""
    text = (COMPONENT / "kustomization.yaml").read_text()
    block = text.split("# --- cuBLAS patch example ---\n", 1)[1].split("# --- end of the example ---", 1)[0]
    loaded: dict[str, Any] = yaml.safe_load("\n".join(line[len("#   "):] for line in block.splitlines()))
    return loaded


def cublas_parts(spec: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    agent = spec["containers"][0]
    return ([a for a in agent["args"] if a.startswith("--remote-gpu-cublas")],
            [m for m in agent["volumeMounts"] if m["name"] == "remote-gpu-cublas"],
            [v for v in spec["volumes"] if v["name"] == "remote-gpu-cublas"])


@pytest.mark.slow  # runs kubectl kustomize and helm
def test_the_kustomize_example_gives_the_agent_what_the_charts_value_gives(tmp_path: Path) -> None:
    kustomize_render.require_kubectl()
    helm_render.require_helm()
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy" / "kustomize" / "base", tmp_path)],
        "components": [os.path.relpath(COMPONENT, tmp_path)], **commented_example()}))
    agents = [d for d in kustomize_render.render(str(tmp_path)) if d["kind"] == "DaemonSet"]
    kustomized = kustomize_render.pod_spec(agents[0])
    charted = kustomize_render.pod_spec(helm_render.find(helm_render.render(
        {"nodeAgent.remoteGpu.enabled": True, "nodeAgent.remoteGpu.cublas.hostPath": HOST_DIR}),
        "DaemonSet", "gpupool-node-agent"))
    assert kustomized is not None and charted is not None
    parts = cublas_parts(kustomized)
    assert parts == cublas_parts(charted)
    assert parts[0] == ["--remote-gpu-cublas=/opt/nvidia-cublas/libcublas.so.12"]
    assert parts[1][0]["readOnly"] is True and parts[2][0]["hostPath"] == {"path": HOST_DIR, "type": "Directory"}
