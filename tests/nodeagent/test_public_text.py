"""Host paths and pids taken out of the free text the control center sees."""

from __future__ import annotations

import pytest

from gpupool.nodeagent.public_text import public


@pytest.mark.parametrize(("text", "shown"), [
    ("library /var/lib/gpupool/lib/libgpupool-shim.so is missing", "library <path> is missing"),
    ("[Errno 13] Permission denied: '/sys/fs/cgroup/kubepods.slice/a b/dmem.max'", "[Errno 13] Permission denied: "
     "'<path>'"),
    ("daemon pid 4242; memory also by dmem (drm/0000:3b:00.0/vram0)",
     "daemon pid ?; memory also by dmem (drm/0000:3b:00.0/vram0)"),
    ("unlink /a/b: busy; rename \"/c d/e\"", "unlink <path>: busy; rename \"<path>\""),
    ("no dmem: no PCI address for the card", "no dmem: no PCI address for the card"),
    ("3000/4096 MiB, 1/2 of the card", "3000/4096 MiB, 1/2 of the card"),
])
def test_paths_and_pids_are_replaced_names_and_figures_kept(text: str, shown: str) -> None:
    assert public(text) == shown
