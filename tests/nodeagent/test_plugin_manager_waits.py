"""The device plugin manager says when kubelet's registration socket is missing: a wrong
``--plugin-dir`` used to wait forever without a word while the node looked served."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gpupool.nodeagent.deviceplugin import manager as manager_module
from gpupool.nodeagent.deviceplugin.manager import DevicePluginManager


class NoAllocations:
    """The manager never reaches a server call in these tests."""


def test_a_missing_kubelet_socket_is_warned_about_and_nothing_registers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(manager_module, "FIRST_MISSING_WARNING_S", 0.05)
    manager = DevicePluginManager(str(tmp_path / "not-kubelets-dir"), ("gpupool.io/gpu-mem",),
                                  NoAllocations(), poll_s=0.01)  # type: ignore[arg-type]

    async def main() -> None:
        task = asyncio.create_task(manager.run())
        await asyncio.sleep(0.3)
        assert not manager.registered.is_set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.INFO, logger=manager_module.__name__):
        asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings, caplog.text
    assert "no kubelet registration socket at" in warnings[0] and "--plugin-dir" in warnings[0]
    assert str(tmp_path / "not-kubelets-dir" / "kubelet.sock") in warnings[0]
    assert len(warnings) <= 3  # 0.05 s, then 0.1 s, then 0.2 s: backed off, not one per poll
