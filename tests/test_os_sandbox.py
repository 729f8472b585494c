"""The os sandbox: a command that escapes, hangs or floods must not harm the host or the lake; no network."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from halo_agent.envs.os_sandbox import TRUNCATION_MARKER, Sandbox, SandboxConfig, check_host

try:
    check_host()
except Exception as e:  # not root, or a tool missing: the env cannot run here at all
    pytest.skip(f"os sandbox unavailable: {e}", allow_module_level=True)


@pytest.fixture
def box():
    with Sandbox(SandboxConfig(timeout_s=2.0, output_limit=4096, memory_mb=256, max_processes=48)) as sandbox:
        yield sandbox


def test_a_fresh_sandbox_is_root_with_its_own_hostname_and_an_empty_tmp(box):
    result = box.run("id -u; hostname; ls -A /tmp | wc -l")
    assert result.exit_code == 0
    assert result.output.split() == ["0", "sandbox", "0"]


def test_files_persist_between_commands_of_one_sample_but_not_across_samples(box):
    assert box.run("echo kept > /etc/halo-marker").exit_code == 0
    assert box.run("cat /etc/halo-marker").output == "kept\n"
    with Sandbox() as other:
        assert other.run("test -e /etc/halo-marker").exit_code == 1


def test_escape_writes_outside_never_reach_the_host(box, tmp_path, lake):
    marker = f"halo-escape-{uuid.uuid4().hex}"
    host_tmp = f"/tmp/{marker}"
    lake_file = os.path.join(lake.root, marker)
    script = (
        f"echo owned > {host_tmp}; echo owned > {lake_file}; echo owned > /etc/{marker}; "
        f"mkdir -p {tmp_path}; echo owned > {tmp_path}/{marker}; "
        # the classic ways out of a chroot or a mount namespace, each refused
        "mount -t tmpfs x /mnt; echo mount=$?; chroot / true; echo chroot=$?; "
        "unshare -m true; echo unshare=$?; ls /proc/1/root/work 2>/dev/null | wc -l"
    )
    result = box.run(script)
    assert not os.path.exists(host_tmp)
    assert not os.path.exists(lake_file)
    assert not os.path.exists(f"/etc/{marker}")
    assert not os.path.exists(tmp_path / marker)
    assert "mount=32" in result.output  # mount(8): permission denied
    assert "chroot=125" in result.output or "chroot=1" in result.output
    assert "unshare=1" in result.output
    assert result.output.rstrip().endswith("0")  # PID 1's root is the sandbox's, not the host's
    assert os.listdir(lake.root)  # the lake is untouched and still there


def test_the_host_lake_and_checkout_are_not_visible(box):
    result = box.run("find /work /root /home -mindepth 1 | wc -l; cat /proc/sys/kernel/hostname; echo x > /proc/sys/kernel/hostname")
    assert result.output.splitlines()[0] == "0"
    assert "Read-only file system" in result.output


def test_hang_is_killed_at_the_timeout_with_its_whole_process_group(box):
    started = time.perf_counter()
    result = box.run("sleep 300 & sleep 301 & (sleep 302; echo never) ; wait", timeout_s=1.0)
    elapsed = time.perf_counter() - started
    assert result.timed_out and result.exit_code is None
    assert elapsed < 5
    survivors = box.run("pgrep -f '^sleep 30[012]$' | wc -l")
    assert survivors.output.strip() == "0"
    assert box.run("echo alive").output == "alive\n"  # the sandbox itself goes on


def test_a_background_child_holding_the_output_does_not_block_the_command(box):
    started = time.perf_counter()
    result = box.run("(sleep 200; echo late) & echo now")
    assert result.exit_code == 0 and result.output == "now\n"
    assert time.perf_counter() - started < 1.5


def test_flood_output_is_truncated_with_a_marker_and_memory_is_bounded(box):
    result = box.run("head -c 50000000 /dev/zero | tr '\\0' y")
    assert result.exit_code == 0 and result.truncated
    assert result.output_bytes == 50_000_000
    kept = result.output[: box.config.output_limit]
    assert set(kept) == {"y"}
    assert result.output.endswith(TRUNCATION_MARKER.format(dropped=50_000_000 - box.config.output_limit))
    memory = box.run("python3 -c 'x = bytearray(1024 ** 3)'")
    assert memory.exit_code != 0 and "MemoryError" in memory.output


def test_fork_bomb_is_capped_and_the_host_keeps_forking(box):
    box.run(":(){ :|:& };:", timeout_s=1.0)
    assert os.system("true") == 0  # the host still forks
    count = len(os.listdir("/proc"))
    assert count < 10_000


def test_no_network(box):
    result = box.run(
        "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=1)\" 2>&1 | tail -1; "
        "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"
    )
    assert "Network is unreachable" in result.output
    assert result.output.split()[-1] == "lo"  # the only interface, and it is down


def test_the_host_environment_does_not_leak_in(box, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-halo-test-secret")
    assert "sk-halo-test-secret" not in box.run("env; cat /proc/1/environ").output


def test_close_kills_everything_and_removes_the_cgroup():
    box = Sandbox()
    box.start()
    box.run("nohup sleep 500 > /dev/null 2>&1 &")
    holder = box.holder_pid
    cgroups = list(box._cgroup.dirs) if box._cgroup else []
    box.close()
    assert not os.path.exists(f"/proc/{holder}")
    assert all(not d.exists() for d in cgroups)
