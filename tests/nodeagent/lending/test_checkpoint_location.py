"""The agent says at start whether its checkpoint root is storage other nodes reach (issue 26)."""

from __future__ import annotations

from pathlib import Path

from gpupool.nodeagent.lending.checkpoint_location import describe, location_of

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /var/lib/gpupool rw shared:9 - xfs /dev/sdb1 rw
41 30 0:52 / /var/lib/gpupool/checkpoint rw,relatime shared:12 - nfs4 filer:/export/ckpt rw,vers=4.2
42 22 0:53 / /mnt/with\\040space rw - cifs //smb/share rw
"""


def test_the_longest_mount_above_the_path_names_its_file_system() -> None:
    assert location_of("/var/lib/gpupool/checkpoint/ns/t", MOUNTINFO).fstype == "nfs4"  # type: ignore[union-attr]
    assert location_of("/var/lib/gpupool/checkpoint", MOUNTINFO).source == "filer:/export/ckpt"  # type: ignore[union-attr]
    assert location_of("/var/lib/gpupool/checkpointX", MOUNTINFO).fstype == "xfs"  # type: ignore[union-attr]
    assert location_of("/srv/ckpt", MOUNTINFO).fstype == "ext4"  # type: ignore[union-attr]
    assert location_of("/mnt/with space/x", MOUNTINFO).fstype == "cifs"  # type: ignore[union-attr]
    assert location_of("/x", "garbage\n - \n") is None


def test_a_local_root_is_called_local_and_a_shared_one_shared(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    shared, said = describe("/var/lib/gpupool/checkpoint", str(table))
    assert shared and "nfs4" in said and "any node" in said
    local, said = describe("/var/lib/gpupool/ckpt", str(table))
    assert not local and "local to this node" in said and "--checkpoint-dir" in said
    unknown, said = describe("/x", str(tmp_path / "none"))
    assert not unknown and "unknown" in said
