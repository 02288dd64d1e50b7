"""Card memory counted in units: a count no card could hold is refused with the unit and what to write."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.api.names import ResourceNames
from gpupool.kube.memory_units import size_text
from gpupool.kube.translate import InvalidObjectError, TranslationError, pod_request
from tests.kube.builders import pod

NAMES = ResourceNames()
WHERE = "pod default/p container main: "


def limits_pod(limits: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    raw = pod("p", {"name": "main", "resources": {"limits": limits}})
    raw["metadata"]["labels"] = dict(labels or {})
    return raw


@pytest.mark.parametrize(("limits", "message"), [
    pytest.param({"gpupool.io/gpu-mem": "4096"},
                 "gpupool.io/gpu-mem counts 256 MiB units: 4096 is 1 TiB; for 4 GiB write 16", id="mib-habit"),
    pytest.param({"gpupool.io/gpu-mem": "4Gi"},
                 "gpupool.io/gpu-mem counts 256 MiB units: 4294967296 is 1 EiB; for 4 GiB write 16",
                 id="binary-suffix"),
    pytest.param({"gpupool.io/gpu-mem": "40960"},
                 "gpupool.io/gpu-mem counts 256 MiB units: 40960 is 10 TiB; for 40 GiB write 160", id="40-gib"),
    pytest.param({"gpupool.io/gpu-mem": "24Gi", "gpupool.io/gpu-core": "50"},
                 "gpupool.io/gpu-mem counts 256 MiB units: 25769803776 is 6 EiB; for 24 GiB write 96",
                 id="suffix-beside-compute"),
    pytest.param({"gpupool.io/gpu-mem": "4G"},
                 "gpupool.io/gpu-mem counts 256 MiB units: 4000000000 is 954 PiB; for 4 GiB write 16",
                 id="decimal-suffix-gets-the-example"),
    pytest.param({"gpupool.io/gpu-mem": "5000"},
                 "gpupool.io/gpu-mem counts 256 MiB units: 5000 is 1.22 TiB; for 4 GiB write 16",
                 id="no-whole-unit-gets-the-example"),
    pytest.param({"gpupool.io/gpu-mem": "9223372036854775807"},
                 "gpupool.io/gpu-mem counts 256 MiB units: 9223372036854775807 is 2048 YiB; for 4 GiB write 16",
                 id="largest-quantity"),
    pytest.param({"tencent.com/vcuda-memory": "8Gi"},
                 "tencent.com/vcuda-memory counts 256 MiB units: 8589934592 is 2 EiB; for 8 GiB write 32",
                 id="gpumanager"),
    pytest.param({"aliyun.com/gpu-mem": "16384"},
                 "aliyun.com/gpu-mem counts GiB: 16384 is 16 TiB; for 16 GiB write 16", id="gpushare-gib"),
])
def test_a_count_in_the_wrong_unit_is_refused_with_what_to_write(limits: dict[str, str], message: str) -> None:
    with pytest.raises(TranslationError) as refused:
        pod_request(limits_pod(limits), NAMES)
    assert str(refused.value) == WHERE + message
    assert not isinstance(refused.value, InvalidObjectError)  # a pod that fits nowhere: 200 with the reason


def test_gpushare_in_mib_and_over_several_cards_reads_per_card() -> None:
    mib = ResourceNames(gpushare_unit_mib=1)
    with pytest.raises(TranslationError) as refused:
        pod_request(limits_pod({"aliyun.com/gpu-mem": "4Gi"}), mib)
    assert str(refused.value) == WHERE + "aliyun.com/gpu-mem counts MiB: 4294967296 is 4 PiB; for 4 GiB write 4096"
    spread = limits_pod({"aliyun.com/gpu-mem": "1024"}, {"aliyun.com/gpu-count": "8"})
    gpu = pod_request(spread, NAMES).containers[0].gpu
    assert gpu is not None and (gpu.count, gpu.memory_mib) == (8, 128 * 1024)  # 128 GiB on each of 8


@pytest.mark.parametrize(("limits", "mib"), [
    pytest.param({"gpupool.io/gpu-mem": "16"}, 4096, id="4-gib"),
    pytest.param({"gpupool.io/gpu-mem": "4095"}, (1 << 20) - 256, id="just-under-1-tib"),
    pytest.param({"tencent.com/vcuda-memory": "320"}, 80 * 1024, id="gpumanager-80-gib"),
])
def test_counts_under_1_tib_are_read_as_before(limits: dict[str, str], mib: int) -> None:
    gpu = pod_request(limits_pod(limits), NAMES).containers[0].gpu
    assert gpu is not None and gpu.memory_mib == mib


@pytest.mark.parametrize(("mib", "text"), [
    (256, "256 MiB"), (1024, "1 GiB"), (1536, "1.5 GiB"), (1 << 20, "1 TiB"), (1 << 40, "1 EiB"),
    (1 << 70, "1024 YiB"),
])
def test_size_text(mib: int, text: str) -> None:
    assert size_text(mib) == text
