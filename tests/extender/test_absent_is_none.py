"""The webhooks' bounded reads on a cache miss (a ResourceGroup, a claim or its template): an object
the API does not have is None, any other failure is the caller's to handle."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpupool.extender.tenancy_watch import absent_is_none


def failing(status: int) -> Any:
    def read() -> Any:
        raise ApiException(status=status, reason="test")
    return read


def test_a_404_is_none_and_an_object_is_itself() -> None:
    assert absent_is_none(failing(404)) is None
    assert absent_is_none(lambda: {"metadata": {"name": "g"}}) == {"metadata": {"name": "g"}}
    assert absent_is_none(lambda: "not an object") is None


@pytest.mark.parametrize("status", [403, 500])
def test_other_failures_raise(status: int) -> None:
    with pytest.raises(ApiException):
        absent_is_none(failing(status))
