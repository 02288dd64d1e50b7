"""The ``enforcement-v1`` Node annotation: what the node writes, the extender and kubectl read back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.api.enforcement import (
    MAX_REASON,
    EnforcementNotice,
    EnforcementNoticeError,
    decode_notice,
    encode_notice,
)


@given(st.sampled_from(["shim", "mps", "none"]), st.booleans(), st.booleans(), st.text(max_size=50))
def test_a_notice_reads_back_as_written(backend: str, enforcing: bool, shares: bool, reason: str) -> None:
    notice = decode_notice(encode_notice(EnforcementNotice(backend, enforcing, shares, reason)))
    assert (notice.backend, notice.enforcing, notice.shares) == (backend, enforcing, shares)
    assert "\n" not in notice.reason and len(notice.reason) <= MAX_REASON


@pytest.mark.parametrize(("text", "message"), [
    pytest.param("{", "not JSON", id="not-json"),
    pytest.param("[1]", "JSON object", id="not-an-object"),
    pytest.param('{"backend": 3, "enforcing": true, "shares": true}', "'backend'", id="backend-not-a-string"),
    pytest.param('{"backend": "shim", "enforcing": "yes", "shares": true}', "true or false", id="enforcing-not-bool"),
    pytest.param('{"backend": "shim", "enforcing": true, "shares": true, "reason": 5}', "'reason'", id="reason"),
])
def test_a_broken_notice_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(EnforcementNoticeError, match=message):
        decode_notice(text)


def test_the_line_a_person_reads() -> None:
    assert EnforcementNotice("shim", True, True).shown() == "shim (enforcing)"
    assert "NOT enforced" in EnforcementNotice("none", False, True, "admin").shown()
    assert "whole cards only" in EnforcementNotice("none", False, False, "no library").shown()
