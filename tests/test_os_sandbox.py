"""The os sandbox: a command that escapes, hangs or floods must not harm the host or the lake, nor read its secrets; no network."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from halo_agent.envs.os_sandbox import HOST_ID_BASE, ID_COUNT, SANDBOX_USERS, TRUNCATION_MARKER, Sandbox, SandboxConfig, check_host

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
        "unshare -m true; echo unshare=$?; unshare -U -r true; echo userns=$?; ls /proc/1/root/work 2>/dev/null | wc -l"
    )
    result = box.run(script)
    assert not os.path.exists(host_tmp)
    assert not os.path.exists(lake_file)
    assert not os.path.exists(f"/etc/{marker}")
    assert not os.path.exists(tmp_path / marker)
    assert "mount=32" in result.output  # mount(8): permission denied
    assert "chroot=125" in result.output or "chroot=1" in result.output
    assert "unshare=1" in result.output
    assert "userns=1" in result.output  # no nested user namespace, where it would be root with every capability
    assert result.output.rstrip().endswith("0")  # PID 1's root is the sandbox's, not the host's
    assert os.listdir(lake.root)  # the lake is untouched and still there


def test_the_host_lake_checkout_and_data_folders_are_not_there(box):
    result = box.run("ls -d /work /opt /old_root /farm 2>&1 | grep -vc 'No such file'; find /root /home /var /tmp -mindepth 1 "
                     "-not -path '/var/*' | wc -l; cat /proc/sys/kernel/hostname; echo x > /proc/sys/kernel/hostname")
    assert result.output.splitlines()[:3] == ["0", "0", "sandbox"]
    assert "Read-only file system" in result.output


def test_root_inside_is_an_unprivileged_id_outside(box):
    result = box.run("id -u; cat /proc/self/uid_map /proc/self/gid_map")
    lines = result.output.split("\n")
    assert lines[0] == "0"
    assert lines[1].split() == ["0", str(HOST_ID_BASE), str(ID_COUNT)]  # not the identity map 0 0 4294967295
    assert lines[2].split() == ["0", str(HOST_ID_BASE), str(ID_COUNT)]
    # Its uid seen from the host. The command returns only once the background child runs sleep: what a command
    # leaves is frozen when it returns, and a child frozen before its exec would stay bash.
    on_host = box.run("sleep 30 & while [ \"$(cat /proc/$!/comm)\" != sleep ]; do :; done; echo $!")
    host_pids = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == "sleep\x0030\x00"]
    assert on_host.exit_code == 0 and host_pids
    assert {os.stat(f"/proc/{p}").st_uid for p in host_pids} == {HOST_ID_BASE}


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""


def test_host_secrets_are_unreadable_inside(box):
    planted = f"/root/halo-secret-{uuid.uuid4().hex}"
    secret = uuid.uuid4().hex
    with open(planted, "w") as f:
        f.write(secret)
    try:
        with open("/etc/shadow") as f:
            host_shadow = [line.strip() for line in f if line.strip()]
        result = box.run(f"cat /etc/shadow /etc/gshadow; cat {planted}; cat /proc/1/root{planted}; "
                         "grep -rs --text -e root: /root /home /var /tmp /srv /run | head -c 2000; cat /etc/passwd")
    finally:
        os.unlink(planted)
    assert secret not in result.output
    assert not [line for line in host_shadow if line in result.output]  # not one line of the host's shadow file
    assert "root:*:" in result.output  # the sandbox's own shadow file, root's password locked
    accounts = box.run("cut -d: -f1 /etc/passwd").output.split()
    assert accounts == [user[0] for user in SANDBOX_USERS]  # the sandbox's accounts, none of the host's


# Each escape prints NAME=ok when the kernel refused it; ctypes calls the syscalls themselves.
ESCAPES = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def refused(name, result):
    print(f"{name}={'ok' if result == -1 else 'ALLOWED'}", flush=True)
refused("mount", libc.mount(b"none", b"/mnt", b"tmpfs", 0, None))
refused("chroot", libc.chroot(b"/srv"))
refused("mknod", libc.mknod(b"/srv/mem", 0o020600, os.makedev(1, 1)))
handle = ctypes.create_string_buffer(8 + 128)
ctypes.c_uint.from_buffer(handle).value = 128
mount_id = ctypes.c_int()
libc.name_to_handle_at(-100, b"/etc/passwd", handle, ctypes.byref(mount_id), 0)
refused("open_by_handle_at", libc.open_by_handle_at(-100, handle, os.O_RDONLY))
refused("ptrace", libc.ptrace(16, int(sys.argv[1]), None, None))  # PTRACE_ATTACH to a host pid
for path, text in (("/proc/sys/kernel/hostname", "owned"), ("/proc/sys/vm/drop_caches", "3"), ("/sys/kernel/uevent_helper", "/x"),
                   ("/sys/fs/cgroup/cgroup.procs", "1")):
    try:
        with open(path, "w") as f:
            f.write(text)
        print(f"write {path}=ALLOWED", flush=True)
    except OSError:
        print(f"write {path}=ok", flush=True)
"""


def test_mount_chroot_mknod_handles_ptrace_and_proc_sys_writes_fail(box):
    script = ESCAPES.replace("int(sys.argv[1])", str(os.getpid()))
    result = box.run(script, interpreter="python")
    verdicts = dict(line.rsplit("=", 1) for line in result.output.splitlines() if "=" in line)
    assert set(verdicts) >= {"mount", "chroot", "mknod", "open_by_handle_at", "ptrace", "write /proc/sys/kernel/hostname",
                             "write /sys/kernel/uevent_helper"}, result.output
    assert set(verdicts.values()) == {"ok"}, result.output


def test_the_init_reaps_orphans_no_zombie_is_left(box):
    assert box.run("sleep 1000 & echo started").output == "started\n"
    box.run("(sleep 0.1 &); (sleep 0.1 & exec true)")
    result = box.run("kill $(pgrep -f '^sleep 1000$'); sleep 0.5; ps -eo stat=,comm= | grep '^Z' | wc -l")
    assert result.output.strip() == "0"


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
    cgroups = [*box._cgroup.dirs.values(), *box._eval_cgroup.dirs.values()] if box._cgroup else []
    box.close()
    assert not os.path.exists(f"/proc/{holder}")
    assert all(not d.exists() for d in cgroups)


def test_the_sandbox_cgroups_sit_under_this_process_own_with_a_cpu_quota(box):
    own = {c: path for line in Path("/proc/self/cgroup").read_text().splitlines() for _, cs, path in [line.split(":", 2)]
           for c in (cs.split(",") if cs else [""])}
    assert box._cgroup.dirs, "no cgroup was made"
    for hierarchy, folder in box._cgroup.dirs.items():
        mine = Path("/sys/fs/cgroup", hierarchy, own[hierarchy].lstrip("/"))
        # inside the server's limits: under its cgroup (v2: next to the leaf its processes moved into)
        assert folder.parent == (mine.parent if mine.name == "halo-server" else mine)
    quota = box._cgroup.dirs.get("") or box._cgroup.dirs.get("cpu")
    if quota is None or not ((quota / "cpu.max").exists() or (quota / "cpu.cfs_quota_us").exists()):
        pytest.skip("this host gives the process's cgroup no cpu controller (the sandbox warns so)")
    limit = (quota / "cpu.max").read_text().split()[0] if (quota / "cpu.max").exists() else (quota / "cpu.cfs_quota_us").read_text().strip()
    assert int(limit) == int(box.config.cpus * 100_000)
