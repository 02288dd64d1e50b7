"""The evictor speaks policy/v1 and falls back to policy/v1beta1 only where the server refuses the
newer version (1.20, 1.21); a budget's refusal is raised at once (the e2e proves policy/v1 against
the current apiserver)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpupool.nodeagent.risk.eviction import evict_with


class Server:
    def __init__(self, refuse: dict[str, int]) -> None:
        self.refuse = refuse
        self.sent: list[str] = []

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.sent.append(body["apiVersion"])
        if body["apiVersion"] in self.refuse:
            raise ApiException(status=self.refuse[body["apiVersion"]])


def test_an_old_server_refusing_policy_v1_gets_v1beta1() -> None:
    server = Server({"policy/v1": 404})
    asyncio.run(evict_with(server)("ns", "rogue"))
    assert server.sent == ["policy/v1", "policy/v1beta1"]


def test_a_current_server_gets_policy_v1_alone() -> None:
    server = Server({})
    asyncio.run(evict_with(server)("ns", "rogue"))
    assert server.sent == ["policy/v1"]


def test_a_budget_refusal_is_raised_without_trying_the_older_version() -> None:
    server = Server({"policy/v1": 429})
    with pytest.raises(ApiException) as refused:
        asyncio.run(evict_with(server)("ns", "rogue"))
    assert refused.value.status == 429 and server.sent == ["policy/v1"]
