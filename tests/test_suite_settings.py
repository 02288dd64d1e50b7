"""The suite-wide settings of tests/conftest.py hold while tests run."""

import os
import sys
from pathlib import Path

import pytest


def test_collection_cached_this_module_rewritten_by_pytest() -> None:
    cached = list((Path(__file__).parent / "__pycache__").glob(f"{Path(__file__).stem}.*-pytest-*.pyc"))
    assert cached, "collection did not cache the rewritten test module"


@pytest.mark.skipif(not os.environ.get("PYTHONDONTWRITEBYTECODE"), reason="PYTHONDONTWRITEBYTECODE is not set")
def test_the_interpreters_bytecode_setting_is_back_once_collection_ended() -> None:
    assert sys.dont_write_bytecode
