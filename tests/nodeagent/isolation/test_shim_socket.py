"""The registration socket with real sockets and real child processes: every bad client gets a
reason (or is dropped) and the server keeps answering the next one."""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from gpupool.api.shim_contract import RegisterReply, RegisterRequest, decode_reply, encode_request
from gpupool.nodeagent.containers.container_directory import InMemoryContainerDirectory
from gpupool.nodeagent.isolation.shim_registry import ShimRegistry
from gpupool.nodeagent.isolation.shim_socket import RegistrationServer
from gpupool.nodeagent.monitor.container_resolver import ContainerResolver
from tests.nodeagent.isolation.shim_client import connection_of_dead_process, exchange, registered_child

UID = "0f3c9a2e-1b7d-4c1e-9a55-3f2b8c7d6e10"
TOKEN = "ab" * 32
GOOD = RegisterRequest(TOKEN, 7, "ns/p", "main")


@asynccontextmanager
async def serving(read_timeout_s: float = 2.0) -> AsyncIterator[RegistrationServer]:
    directory = InMemoryContainerDirectory()
    registry = ShimRegistry(ContainerResolver(directory).cgroup_identity, directory)
    registry.issue(TOKEN, UID, "main", "ns", "p")
    with tempfile.TemporaryDirectory(prefix="gs", dir="/tmp") as base:  # short unix socket path
        server = RegistrationServer(os.path.join(base, "agent.sock"), registry, read_timeout_s)
        await server.start()
        try:
            yield server
        finally:
            await server.stop()


def run(test: Callable[[RegistrationServer], Awaitable[None]], read_timeout_s: float = 2.0) -> None:
    async def main() -> None:
        async with serving(read_timeout_s) as server:
            await test(server)
    asyncio.run(main())


async def still_serving(server: RegistrationServer) -> None:
    reply = decode_reply(await asyncio.to_thread(exchange, server.path, encode_request(GOOD)))
    assert reply.ok, reply.reason


def test_a_child_process_registers_and_is_pruned_when_it_exits() -> None:
    async def test(server: RegistrationServer) -> None:
        def register() -> int:
            with registered_child(server.path, GOOD) as (child, reply):
                assert reply.ok, reply.reason
                return child.pid
        pid = await asyncio.to_thread(register)  # the child has exited and been reaped here
        assert server.registry.stats.accepted == 1
        assert server.registry.processes(UID, "main") == []
        assert pid != os.getpid()

    run(test)


def test_the_recorded_pid_is_the_registering_process() -> None:
    async def test(server: RegistrationServer) -> None:
        def register() -> tuple[int, list[int]]:
            with registered_child(server.path, GOOD) as (child, reply):
                assert reply.ok, reply.reason
                return child.pid, [p.pid for p in server.registry.processes(UID, "main")]
        pid, recorded = await asyncio.to_thread(register)
        assert recorded == [pid]

    run(test)


def test_the_reply_hands_the_registering_process_its_pid_as_the_agent_sees_it() -> None:
    async def test(server: RegistrationServer) -> None:
        def register() -> tuple[int, int | None]:
            with registered_child(server.path, GOOD) as (child, reply):
                assert reply.ok, reply.reason
                return child.pid, reply.host_pid
        pid, host_pid = await asyncio.to_thread(register)
        assert host_pid == pid != GOOD.pid  # SO_PEERCRED's pid, not the one the request reported

    run(test)


def test_a_refusal_carries_no_host_pid() -> None:
    async def test(server: RegistrationServer) -> None:
        bad = RegisterRequest("cd" * 32, 7, "ns/p", "main")
        reply = decode_reply(await asyncio.to_thread(exchange, server.path, encode_request(bad)))
        assert not reply.ok and reply.host_pid is None

    run(test)


def test_socket_is_connectable_by_any_user_and_removed_at_stop() -> None:
    async def main() -> None:
        async with serving() as server:
            assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o666
            path = server.path
        assert not os.path.exists(path)
    asyncio.run(main())


def test_malformed_line_gets_a_reason() -> None:
    async def test(server: RegistrationServer) -> None:
        reply = decode_reply(await asyncio.to_thread(exchange, server.path, b"hello\n"))
        assert not reply.ok and "not a JSON line" in reply.reason
        await still_serving(server)
        assert server.registry.stats.refused == {"malformed": 1}

    run(test)


def test_oversized_line_is_refused_unread() -> None:
    async def test(server: RegistrationServer) -> None:
        for data in (b"x" * 5000, b"x" * 5000 + b"\n", b"x" * 4096 + b"\n"):
            reply = decode_reply(await asyncio.to_thread(exchange, server.path, data))
            assert not reply.ok and "longer than 4096 bytes" in reply.reason, (len(data), reply)
        await still_serving(server)

    run(test)


def test_unknown_token_is_refused() -> None:
    async def test(server: RegistrationServer) -> None:
        bad = RegisterRequest("cd" * 32, 7, "ns/p", "main")
        reply = decode_reply(await asyncio.to_thread(exchange, server.path, encode_request(bad)))
        assert not reply.ok and "unknown token" in reply.reason
        await still_serving(server)

    run(test)


def test_a_silent_client_is_answered_after_the_timeout() -> None:
    async def test(server: RegistrationServer) -> None:
        reply = decode_reply(await asyncio.to_thread(exchange, server.path, b"{\"v\":1"))
        assert not reply.ok and "no request line within 0.3 s" in reply.reason
        await still_serving(server)

    run(test, read_timeout_s=0.3)


def test_a_client_that_hangs_up_early_does_not_stop_the_server() -> None:
    async def test(server: RegistrationServer) -> None:
        def hang_up(data: bytes) -> None:
            import socket
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(server.path)
                if data:
                    sock.sendall(data)
        for data in (b"", b"{\"v\":", encode_request(GOOD)):
            await asyncio.to_thread(hang_up, data)
        await asyncio.sleep(0.1)
        await still_serving(server)

    run(test)


def test_a_peer_that_is_gone_is_refused() -> None:
    """The connecting process exited before its line was read: its pid names nobody (or, later,
    another process), so it is not recorded."""
    async def test(server: RegistrationServer) -> None:
        def send_for_the_dead() -> tuple[bytes, int]:
            sock, pid = connection_of_dead_process(server.path)
            with sock:
                sock.sendall(encode_request(GOOD))
                return sock.makefile("rb").readline(), pid
        line, pid = await asyncio.to_thread(send_for_the_dead)
        reply = decode_reply(line)
        assert not reply.ok and reply.reason == f"process {pid} is gone"
        assert server.registry.processes(UID, "main") == []
        await still_serving(server)

    run(test)


def test_many_clients_at_once() -> None:
    async def test(server: RegistrationServer) -> None:
        replies = await asyncio.gather(*(asyncio.to_thread(exchange, server.path, encode_request(GOOD))
                                         for _ in range(100)))
        assert all(decode_reply(r).ok for r in replies)
        stats = server.registry.stats  # one process (this one): registered once, the rest renewals too soon
        assert (stats.accepted, stats.throttled) == (1, 99)

    run(test)


def test_an_accepted_reply_asks_for_renewals_at_the_registry_interval() -> None:
    async def test(server: RegistrationServer) -> None:
        def register() -> RegisterReply:
            with registered_child(server.path, GOOD) as (_child, reply):
                return reply
        reply = await asyncio.to_thread(register)
        assert reply.ok and reply.renew_s == server.registry.heartbeat_s == 10

    run(test)
