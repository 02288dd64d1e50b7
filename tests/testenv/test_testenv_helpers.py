"""Unit tests of the test environment's small helpers: ports, node IP, mounts, flags, records."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupool.testenv.controlplane import DISABLED_ADMISSION_PLUGINS, apiserver_args
from gpupool.testenv.errors import StartupError
from gpupool.testenv.kubelet import mounts_below, node_is_ready
from gpupool.testenv.nodeip import parse_ipv4_addresses, pick_node_ip
from gpupool.testenv.pki import subject_alt_names
from gpupool.testenv.ports import free_port, free_ports
from gpupool.testenv.procs import ManagedProcess, pid_runs, spawn, wait_until


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_free_port_is_in_user_range() -> None:
    assert 1024 < free_port() < 65536


def test_free_ports_rejects_negative() -> None:
    with pytest.raises(ValueError):
        free_ports(-1)


IP_OUTPUT = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth1    inet 169.254.3.4/16 scope link eth1\\       valid_lft forever preferred_lft forever
4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever
"""


def test_parse_ip_output() -> None:
    assert parse_ipv4_addresses(IP_OUTPUT) == [
        ("lo", "127.0.0.1"), ("eth1", "169.254.3.4"), ("eth0", "192.0.2.2"),
    ]


def test_pick_node_ip_skips_loopback_and_link_local() -> None:
    assert pick_node_ip(parse_ipv4_addresses(IP_OUTPUT)) == "192.0.2.2"
    assert pick_node_ip([("lo", "127.0.0.1"), ("x", "169.254.1.1")]) is None
    assert pick_node_ip([]) is None


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
90 27 0:50 / /tmp/env/kubelets/n1/root rw - ext4 /dev/vda rw
91 90 0:51 / /tmp/env/kubelets/n1/root/pods/x/volumes rw - tmpfs tmpfs rw
92 27 0:52 / /tmp/env/kubelets/n10 rw - ext4 /dev/vda rw
"""


def test_mounts_below_lists_deepest_first_and_respects_path_boundaries() -> None:
    assert mounts_below(Path("/tmp/env/kubelets/n1"), MOUNTINFO) == [
        Path("/tmp/env/kubelets/n1/root/pods/x/volumes"), Path("/tmp/env/kubelets/n1/root"),
    ]


def test_node_is_ready() -> None:
    assert node_is_ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert not node_is_ready({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert not node_is_ready({"status": {}})


def test_subject_alt_names_mixes_ips_and_names() -> None:
    assert subject_alt_names(["127.0.0.1", "localhost", "::1"]) == "IP:127.0.0.1,DNS:localhost,IP:::1"


def test_apiserver_args_carry_the_flags_the_recipe_needs(tmp_path: Path) -> None:
    args = apiserver_args(etcd_url="http://127.0.0.1:1", port=2, cert=tmp_path / "c", key=tmp_path / "k",
                          sa_key=tmp_path / "sa", token_file=tmp_path / "t", cert_dir=tmp_path)
    assert "--bind-address=127.0.0.1" in args
    assert "--secure-port=2" in args
    assert not any(a.startswith("--insecure-port") for a in args)  # gone since 1.24
    assert "--authorization-mode=RBAC" in args
    assert "--kubelet-preferred-address-types=InternalIP" in args
    assert f"--disable-admission-plugins={','.join(DISABLED_ADMISSION_PLUGINS)}" in args
    assert set(DISABLED_ADMISSION_PLUGINS) == {"ServiceAccount", "TaintNodesByCondition"}


def test_managed_process_stop_and_record_round_trip(tmp_path: Path) -> None:
    proc = spawn("sleeper", [sys.executable, "-c", "import time; print('hi', flush=True); time.sleep(60)"],
                 tmp_path / "log" / "sleeper.log", executable=Path(sys.executable))
    wait_until(lambda: "hi" in proc.log_tail(), what="output", timeout=10, watch=[proc])
    adopted = ManagedProcess.from_record(proc.to_record())
    assert adopted.alive()
    assert pid_runs(proc.pid, Path(sys.executable))
    assert not pid_runs(proc.pid, Path("/bin/true"))  # a recycled pid running something else
    proc.stop(timeout=5)
    assert not proc.alive()
    assert not adopted.alive()


@pytest.mark.slow
def test_managed_process_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('x', flush=True); time.sleep(60)")
    proc = spawn("stubborn", [sys.executable, "-c", code], tmp_path / "s.log")
    wait_until(lambda: "x" in proc.log_tail(), what="output", timeout=10)
    started = time.monotonic()
    proc.stop(timeout=0.5)
    assert not proc.alive()
    assert time.monotonic() - started < 5


def test_wait_until_reports_an_exited_process_with_its_log(tmp_path: Path) -> None:
    proc = spawn("failing", ["sh", "-c", "echo boom-message; exit 3"], tmp_path / "f.log")
    with pytest.raises(StartupError, match="boom-message"):
        wait_until(lambda: False, what="never", timeout=10, watch=[proc])


def test_wait_until_times_out_with_a_clear_message() -> None:
    with pytest.raises(StartupError, match="timed out after 0s waiting for the moon"):
        wait_until(lambda: False, what="the moon", timeout=0.3)


def test_wait_until_treats_oserror_as_not_ready() -> None:
    calls = []

    def ready() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError
        return True

    wait_until(ready, what="x", timeout=5, interval=0.01)
    assert len(calls) == 3


def test_spawned_process_gets_its_own_session(tmp_path: Path) -> None:
    proc = spawn("s", ["sleep", "30"], tmp_path / "s.log")
    try:
        sid = int(subprocess.run(["ps", "-o", "sid=", "-p", str(proc.pid)], capture_output=True,
                                 text=True, check=True).stdout)
        assert sid == proc.pid
    finally:
        proc.stop()


NODE_IP_PROBE = """
import socket
from gpupool.testenv.nodeip import DUMMY_ADDRESS, find_node_ip
ip = find_node_ip()
assert ip == DUMMY_ADDRESS, ip
server = socket.socket()
server.bind((ip, 0))
server.listen()
socket.create_connection(server.getsockname(), timeout=2).close()
assert find_node_ip() == ip  # the second call reuses the interface
print("ok")
"""


@pytest.mark.slow
def test_a_machine_without_addresses_gets_a_usable_node_ip() -> None:
    """In a fresh network namespace (only loopback) find_node_ip creates an address that works."""
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {probe.stderr.decode().strip()}")
    result = subprocess.run(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" -c "$1"', sys.executable,
         NODE_IP_PROBE], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
