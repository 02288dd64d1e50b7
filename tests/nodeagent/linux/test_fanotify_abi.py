"""Parsing the fanotify read buffer (pure, no kernel)."""

from __future__ import annotations

import pytest

from gpupool.nodeagent.linux import fanotify_abi as abi


def test_several_records_in_one_buffer_are_split() -> None:
    buffer = abi.encode_metadata(abi.FAN_OPEN_PERM, 7, 100) + abi.encode_metadata(abi.FAN_CLOSE_NOWRITE, 8, 101)
    assert abi.parse_events(buffer) == [abi.RawEvent(abi.FAN_OPEN_PERM, 7, 100),
                                        abi.RawEvent(abi.FAN_CLOSE_NOWRITE, 8, 101)]


@pytest.mark.parametrize("buffer, message", [
    pytest.param(abi.encode_metadata(abi.FAN_OPEN, 3, 1)[:10], "truncated", id="truncated-record"),
    pytest.param(b"\x18\x00\x00\x00\x02" + abi.encode_metadata(abi.FAN_OPEN, 3, 1)[5:], "version",
                 id="old-metadata-version"),
    pytest.param(b"\xff\x00\x00\x00" + abi.encode_metadata(abi.FAN_OPEN, 3, 1)[4:], "length",
                 id="length-past-the-buffer"),
])
def test_a_malformed_buffer_is_refused(buffer: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        abi.parse_events(buffer)


def test_the_response_names_the_fd_and_the_answer() -> None:
    assert abi.encode_response(9, allow=True) == (9).to_bytes(4, "little") + abi.FAN_ALLOW.to_bytes(4, "little")
    assert abi.encode_response(9, allow=False)[4:] == abi.FAN_DENY.to_bytes(4, "little")
