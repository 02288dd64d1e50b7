"""The contract's annotation and label keys: every component derives them from one domain."""

from __future__ import annotations

import pytest

from gpupool.api.names import ResourceNames

EXAMPLE = ResourceNames("gpu.example.com")


@pytest.mark.parametrize(("key", "expected"), [
    pytest.param(EXAMPLE.inventory, "gpu.example.com/inventory-v1", id="node-inventory"),
    pytest.param(EXAMPLE.assignment, "gpu.example.com/assignment-v1", id="pod-assignment"),
    pytest.param(EXAMPLE.allocated, "gpu.example.com/allocated-v1", id="pod-allocated"),
    pytest.param(EXAMPLE.gpu_models, "gpu.example.com/gpu-models", id="pod-allowed-models"),
    pytest.param(EXAMPLE.exclusive, "gpu.example.com/exclusive", id="pod-exclusive"),
    pytest.param(EXAMPLE.model_label, "gpu.example.com/gpu-model", id="node-model-label"),
])
def test_keys_live_under_the_configured_domain(key: str, expected: str) -> None:
    assert key == expected
