"""Deeply nested bodies get a 400 before any parser recurses into them.

orjson before 3.9.15 (3.8.3 is what this project's floor allowed) builds a document by recursing in
Rust, about 64 bytes of C stack per level and no limit: 140,000 nested ``[`` and as many ``]`` (280
kB, far under the 16 MiB body cap) overflowed the 8 MiB main thread, and killed the process with
SIGSEGV. Each HTTP test here serves from a thread with a 256 KiB stack and Hypothesis' kind of raised
recursion limit, so a body that reaches a recursive parser crashes at once instead of only past
130,000 levels.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpupool.api.names import ResourceNames
from gpupool.extender.admission import QuotaAdmission
from gpupool.extender.binder import Binder
from gpupool.extender.cache import ClusterCache
from gpupool.extender.http.admission_review import ADMISSION_PATH, AdmissionApi
from gpupool.extender.http.api import ExtenderApi
from gpupool.extender.http.body import BodyReader
from gpupool.extender.metrics import ExtenderMetrics
from gpupool.extender.service import ExtenderService
from gpupool.testing.fake_api import FakePodApi
from tests.extender.http_world import ALIBABA_NODES, ALIBABA_PODS
from tests.extender.tenancy_world import quota, world
from tests.kube.builders import container, node, pod

T = TypeVar("T")
SMALL_STACK = 256 * 1024
RAISED_RECURSION_LIMIT = 100_000
DEEP = 100_000
VALID = json.dumps({"Pod": pod("ok", container(mib=8138)), "NodeNames": ["N1", "N2", "N3"]}).encode()
NESTED_ARRAYS = b"[" * DEEP + b"]" * DEEP
NESTED_OBJECTS = b'{"a":' * DEEP + b"1" + b"}" * DEEP
NESTED_IN_A_FILTER = b'{"Pod":' + b"[" * DEEP + b"]" * DEEP + b',"NodeNames":["N1"]}'


@pytest.fixture
def raised_recursion_limit() -> Iterator[None]:
    """What Hypothesis does while a test runs: C code that counts its depth against this limit may go
    this deep, so only a check of the body's own depth keeps such code safe."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(RAISED_RECURSION_LIMIT)
    yield
    sys.setrecursionlimit(previous)


def on_a_small_stack(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(main())`` on a thread of SMALL_STACK bytes: server and client both live there."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = asyncio.run(main())
        except BaseException as exc:  # re-raised on the test's thread
            outcome["error"] = exc

    previous = threading.stack_size(SMALL_STACK)
    try:
        thread = threading.Thread(target=run, name="small-stack-server")
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join(timeout=60)
    assert not thread.is_alive(), "the server thread did not finish"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def post_to_extender(*requests: tuple[str, bytes]) -> list[tuple[int, dict[str, Any]]]:
    cache = ClusterCache()
    cache.replace_nodes(ALIBABA_NODES)
    cache.replace_pods(ALIBABA_PODS)
    service = ExtenderService(cache, Binder(cache, FakePodApi()), is_leader=lambda: True, leader_name=lambda: "r0")
    app = ExtenderApi(service, ResourceNames(), ExtenderMetrics(ledger=cache)).app()

    async def main() -> list[tuple[int, dict[str, Any]]]:
        async with TestClient(TestServer(app)) as client:
            answers = []
            for path, body in requests:
                resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
                answers.append((resp.status, json.loads(await resp.read())))
            return answers

    return on_a_small_stack(main)


@pytest.mark.usefixtures("raised_recursion_limit")
@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
@pytest.mark.parametrize("body", [pytest.param(NESTED_ARRAYS, id="arrays"), pytest.param(NESTED_OBJECTS, id="objects"),
                                  pytest.param(NESTED_IN_A_FILTER, id="inside-a-filter")])
def test_a_body_nested_100000_deep_gets_400_and_the_server_still_answers(verb: str, body: bytes) -> None:
    (status, answer), (valid_status, valid) = post_to_extender((f"/{verb}", body), ("/filter", VALID))
    assert status == 400, answer
    assert answer["Error"] == f"bad {verb} request: JSON nested deeper than 64 arrays and objects", answer
    assert (valid_status, valid["NodeNames"]) == (200, ["N3"]), valid


def test_64_levels_are_read_and_65_are_refused() -> None:
    """At the bound the body is parsed (and refused for its shape); one level more is refused unread."""
    at_bound = b'{"Pod":' + b"[" * 63 + b"]" * 63 + b',"NodeNames":["N1"]}'
    past_bound = b'{"Pod":' + b"[" * 64 + b"]" * 64 + b',"NodeNames":["N1"]}'
    (status, answer), (past_status, past) = post_to_extender(("/filter", at_bound), ("/filter", past_bound))
    assert status == 400 and "nested" not in answer["Error"], answer
    assert past_status == 400 and past["Error"] == "bad filter request: JSON nested deeper than 64 arrays and objects"


def test_brackets_inside_strings_do_not_count() -> None:
    names = ["[" * 100, "{" * 100 + '\\"[[[', "]" * 50 + "\\"]
    body = json.dumps({"Pod": pod("ok", container(mib=8138)), "NodeNames": ["N1", "N2", "N3", *names]}).encode()
    ((status, answer),) = post_to_extender(("/filter", body))
    assert (status, answer["NodeNames"]) == (200, ["N3"]), answer


@pytest.mark.usefixtures("raised_recursion_limit")
@pytest.mark.parametrize("body", [pytest.param(NESTED_ARRAYS, id="arrays"), pytest.param(NESTED_OBJECTS, id="objects")])
def test_the_admission_webhook_refuses_a_body_nested_100000_deep(body: bytes) -> None:
    cache = world([node("n1", [16_384] * 4)], quotas=[quota("team-a", hard={"wholeGpus": 1})])
    api = AdmissionApi(QuotaAdmission(cache, cache.names), ExtenderMetrics(), BodyReader())

    async def main() -> tuple[int, dict[str, Any]]:
        async with TestClient(TestServer(api.app())) as client:
            resp = await client.post(ADMISSION_PATH, data=body, headers={"Content-Type": "application/json"})
            return resp.status, json.loads(await resp.read())

    status, answer = on_a_small_stack(main)
    assert (status, answer) == (400, {"Error": "bad admission request: JSON nested deeper than 64 arrays and objects"})
