"""Concurrent prepares and unprepares write their CDI specs and the checkpoint together, in one
worker-thread call (:mod:`gpupool.nodeagent.dra.spec_batch`), with each call's guarantees kept:
it answers once its spec is written and the checkpoint holds it, a spec that fails fails only its
claim, and an unprepare made while a spec is written wins."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pytest

from gpupool.nodeagent.dra import checkpoint, spec_batch
from gpupool.nodeagent.dra.cdi import CdiSpecs
from gpupool.nodeagent.dra.claim_allocation import ClaimRef
from gpupool.nodeagent.dra.claim_state import ClaimState
from gpupool.testing.fake_dra_kubelet import ClaimName
from tests.nodeagent.dra.dra_world import ClaimStore, claim_object, inventory, make_driver, result, temp_dir

T = TypeVar("T")


def count_hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``asyncio.to_thread`` call from now on, by the function handed off."""
    handed: list[str] = []
    real = asyncio.to_thread

    async def counting(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        handed.append(getattr(func, "__name__", repr(func)))
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    return handed


def ref(name: ClaimName) -> ClaimRef:
    return ClaimRef(name.namespace, name.name, name.uid)


def node_with(d: str, count: int) -> tuple[ClaimState, list[ClaimName]]:
    claims = ClaimStore()
    names = [claims.add(claim_object(f"c{i}", f"uid-{i}", [result(f"gpu-{i % 2}", "256Mi")])) for i in range(count)]
    return make_driver(d, claims, [inventory()]).state, names


def test_concurrent_prepares_share_one_thread_call_for_specs_and_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        with temp_dir() as d:
            state, names = node_with(d, 40)
            handed = count_hand_offs(monkeypatch)
            answers = await asyncio.gather(*(state.prepare([ref(n)]) for n in names))
            assert all(not isinstance(a[n.uid], str) for a, n in zip(answers, names, strict=True))
            assert len(handed) <= 4  # one per batch: 40 specs and their checkpoint, not 40 + a few
            assert set(checkpoint.load(state.checkpoint_path)) == {n.uid for n in names}
            assert len(os.listdir(f"{d}/cdi")) == 40
    asyncio.run(main())


def test_one_prepare_writes_its_spec_and_the_checkpoint_in_one_thread_call(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        with temp_dir() as d:
            state, names = node_with(d, 1)
            handed = count_hand_offs(monkeypatch)
            assert not isinstance((await state.prepare([ref(names[0])]))[names[0].uid], str)
            assert handed == ["_write_all"]
            assert set(checkpoint.load(state.checkpoint_path)) == {names[0].uid}
            handed.clear()
            assert await state.unprepare([ref(names[0])]) == {names[0].uid: ""}
            assert handed == ["_write_all"] and checkpoint.load(state.checkpoint_path) == {}
    asyncio.run(main())


def test_a_spec_that_fails_in_a_shared_batch_fails_only_its_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = CdiSpecs.write

    def failing_for_3(self: CdiSpecs, uid: str, grant: Any) -> str:
        if uid == "uid-3":
            raise OSError("Read-only file system")
        return real_write(self, uid, grant)

    monkeypatch.setattr(CdiSpecs, "write", failing_for_3)

    async def main() -> None:
        with temp_dir() as d:
            state, names = node_with(d, 8)
            handed = count_hand_offs(monkeypatch)
            answers = await asyncio.gather(*(state.prepare([ref(n)]) for n in names))
            assert len(handed) <= 2  # they did share a batch
            refused = {n.uid for a, n in zip(answers, names, strict=True) if isinstance(a[n.uid], str)}
            assert refused == {"uid-3"}
            assert "Read-only file system" in str(answers[3]["uid-3"])
            assert set(state.claims) == {n.uid for n in names} - {"uid-3"}
            assert set(checkpoint.load(state.checkpoint_path)) == set(state.claims)  # never held uid-3
            assert not state.cdi.exists("uid-3")
            monkeypatch.setattr(CdiSpecs, "write", real_write)
            assert not isinstance((await state.prepare([ref(names[3])]))["uid-3"], str)  # kubelet's retry
    asyncio.run(main())


def test_a_failed_checkpoint_fails_the_batch_and_still_forgets_a_claim_whose_spec_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CdiSpecs, "write", lambda self, uid, grant: (_ for _ in ()).throw(OSError("spec")))

    def no_space(path: str, claims: Mapping[str, Any], *kept: Any) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint, "save", no_space)

    async def main() -> None:
        with temp_dir() as d:
            state, names = node_with(d, 1)
            with pytest.raises(OSError, match="No space left on device"):
                await state.prepare([ref(names[0])])
            assert state.claims == {}
    asyncio.run(main())


def test_an_unprepare_while_the_spec_is_written_leaves_no_spec_and_waits_for_the_checkpoint_without_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = CdiSpecs.write
    writing, release = threading.Event(), threading.Event()

    def slow_write(self: CdiSpecs, uid: str, grant: Any) -> str:
        writing.set()
        assert release.wait(10)
        return real_write(self, uid, grant)

    monkeypatch.setattr(CdiSpecs, "write", slow_write)

    async def main() -> None:
        with temp_dir() as d:
            state, names = node_with(d, 1)
            prepare = asyncio.create_task(state.prepare([ref(names[0])]))
            assert await asyncio.to_thread(writing.wait, 10)
            unprepare = asyncio.create_task(state.unprepare([ref(names[0])]))
            at_answer: list[tuple[bool, set[str]]] = []
            unprepare.add_done_callback(lambda _: at_answer.append(
                (state.cdi.exists(names[0].uid), set(checkpoint.load(state.checkpoint_path)))))
            await asyncio.sleep(0.05)
            assert not unprepare.done()  # it waits for the checkpoint, written after the batch in flight
            release.set()
            await prepare
            assert await unprepare == {names[0].uid: ""}
            assert at_answer == [(False, set())]  # answered with the spec gone and the checkpoint without it
            assert checkpoint.load(state.checkpoint_path) == {}
            assert not state.cdi.exists(names[0].uid) and state.claims == {}
    asyncio.run(main())


def test_calls_arriving_one_after_another_share_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubelet's calls reach the plugin spread out (100 took 30-60 ms on the loaded test machine):
    the writer waits while they still arrive, so they share one thread call and checkpoint write
    instead of making a batch each of the few that came while the one before was written."""
    monkeypatch.setattr(spec_batch, "SETTLE_PAUSE_S", 0.005)
    monkeypatch.setattr(spec_batch, "SETTLE_MOST_S", 1.0)

    async def main() -> None:
        with temp_dir() as d:
            state, names = node_with(d, 10)
            handed = count_hand_offs(monkeypatch)
            calls = []
            for n in names:
                calls.append(asyncio.create_task(state.prepare([ref(n)])))
                await asyncio.sleep(0.001)
            answers = await asyncio.gather(*calls)
            assert all(not isinstance(a[n.uid], str) for a, n in zip(answers, names, strict=True))
            assert len(handed) <= 2
            assert set(checkpoint.load(state.checkpoint_path)) == {n.uid for n in names}
    asyncio.run(main())


def test_calls_that_never_stop_arriving_are_still_written_within_the_settle_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_batch, "SETTLE_PAUSE_S", 0.02)
    monkeypatch.setattr(spec_batch, "SETTLE_MOST_S", 0.05)

    async def main() -> None:
        with temp_dir() as d:
            state, names = node_with(d, 40)
            first = asyncio.create_task(state.prepare([ref(names[0])]))
            others = []
            for n in names[1:]:  # one call every 10 ms, for 0.4 s: never a pause of 20 ms
                await asyncio.sleep(0.01)
                others.append(asyncio.create_task(state.prepare([ref(n)])))
                if first.done():
                    break
            assert first.done() and not isinstance(first.result()[names[0].uid], str)
            assert len(others) < len(names) - 1  # answered before the stream ended
            await asyncio.gather(*others)
    asyncio.run(main())


def test_a_one_claim_prepare_reads_its_claim_without_a_task_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubelet's usual call names one claim; 100 at once paid 100 gather tasks on the loop."""
    gathered: list[int] = []
    real = asyncio.gather

    def counting(*aws: Any, **kwargs: Any) -> Any:
        gathered.append(len(aws))
        return real(*aws, **kwargs)

    async def main() -> None:
        with temp_dir() as d:
            state, names = node_with(d, 3)

            async def broken(namespace: str, name: str) -> Mapping[str, Any] | None:
                raise ConnectionError("apiserver unreachable")

            monkeypatch.setattr(asyncio, "gather", counting)
            assert not isinstance((await state.prepare([ref(names[0])]))[names[0].uid], str)
            assert gathered == []
            monkeypatch.setattr(state, "_read_claim", broken)  # a failed read still refuses only its claim
            answer = (await state.prepare([ref(names[1])]))[names[1].uid]
            assert isinstance(answer, str) and "apiserver unreachable" in answer
            assert set(state.claims) == {names[0].uid}
            assert gathered == []
    asyncio.run(main())


def test_a_writer_cancelled_while_callers_arrive_cancels_them_rather_than_leave_them_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec_batch, "SETTLE_PAUSE_S", 0.5)

    async def main() -> None:
        with temp_dir() as d:
            state, names = node_with(d, 1)
            call = asyncio.create_task(state.prepare([ref(names[0])]))
            while state._writer._writer is None:  # the writer starts waiting for more callers
                await asyncio.sleep(0.001)
            state._writer._writer.cancel()  # as at the loop's shutdown
            done, _ = await asyncio.wait([call], timeout=5)
            assert call in done and call.cancelled()
    asyncio.run(main())
