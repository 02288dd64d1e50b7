"""Rendered manifests are parsed once per text and every caller gets a copy of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from tests.deploy.yaml_documents import documents

TEXT = """\
---
# Source: a comment-only document is dropped
---
apiVersion: v1
kind: ConfigMap
metadata: {name: a, labels: {x: "1"}}
data: {k: "yes", n: 010, on: true}
---
apiVersion: v1
kind: Service
metadata: {name: b}
spec: {ports: [{port: 80}]}
"""


def test_the_objects_are_pyyamls_safe_reading() -> None:
    assert documents(TEXT) == [d for d in yaml.safe_load_all(TEXT) if d is not None]


def test_each_call_gets_a_copy_it_may_change() -> None:
    first = documents(TEXT)
    first[0]["metadata"]["labels"]["x"] = "changed"
    first.pop()
    again = documents(TEXT)
    assert again[0]["metadata"]["labels"]["x"] == "1" and len(again) == 2
    assert again[1]["spec"]["ports"] is not documents(TEXT)[1]["spec"]["ports"]


def test_a_text_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    parses: list[str] = []
    load_all = yaml.load_all

    def counting(text: str, Loader: type[yaml.SafeLoader]) -> Iterator[object]:
        parses.append(text)
        return load_all(text, Loader=Loader)

    monkeypatch.setattr(yaml, "load_all", counting)
    text = TEXT + "---\nkind: Once\n"
    assert documents(text) == documents(text) == documents(text)
    assert parses == [text]
