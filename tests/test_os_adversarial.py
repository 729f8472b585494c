"""The os sandbox against a hostile policy: each probe a command (or a client) may try, and what must hold.

A policy trained with RL on the os environment is rewarded for whatever makes the evaluation pass, so
every way from a command to the grader, the host or the next sample is probed here: a loader preload
written inside (capabilities, a forged grade), a fake loader behind /lib64, Python's usercustomize and
sitecustomize, the server's kernel keyring, processes left spinning after their command, a check
stalled on a fifo, a command past the argument limit, two requests on one sample at once, and a server
killed with SIGKILL. Protocol misuse and LifelongAgentBench's lifelong callback are in test_task_server.py.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from pathlib import Path

import pytest

from halo_agent.envs.os_sandbox import Sandbox, SandboxConfig, check_host

try:
    check_host()
except Exception as e:  # not root, or a tool missing: the env cannot run here at all
    pytest.skip(f"os sandbox unavailable: {e}", allow_module_level=True)

pytest.importorskip("fastapi")
from halo_agent.envs.os_env import OSSession, RewardMap  # noqa: E402
from halo_agent.envs.os_tasks import OSTask, Script  # noqa: E402

from test_task_server import LabTaskClient, bash, new_session, start_server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
needs_cc = pytest.mark.skipif(shutil.which("gcc") is None, reason="the probes compile their payloads with gcc")
CONFIG = SandboxConfig(timeout_s=10, max_processes=48)
SYS_BIT_ADMIN = 1 << 21  # CAP_SYS_ADMIN

# A library that, loaded into any process, logs that process's effective capabilities and tries a mount.
PROBE_SO = r"""
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
__attribute__((constructor)) static void probe(void) {
    char line[256];
    FILE *status = fopen("/proc/self/status", "r"), *log = fopen("/tmp/probe.log", "a");
    if (!status || !log) return;
    while (fgets(line, sizeof line, status)) if (!strncmp(line, "CapEff:", 7)) fputs(line, log);
    fprintf(log, "mount=%d\n", mount("none", "/mnt", "tmpfs", 0, 0));
    fclose(log);
    fclose(status);
}
"""
# A library that makes every process that loads it exit 0 at once: every check "passes".
FORGE_SO = "#include <unistd.h>\n__attribute__((constructor)) static void forge(void) { _exit(0); }\n"
# A "dynamic loader" that exits 0: behind /lib64, every dynamically linked program "passes".
FAKE_LOADER = 'void _start(void) { __asm__ volatile("mov $60, %eax\\n xor %edi, %edi\\n syscall"); }\n'


def _write(path: str, text: str) -> str:
    """A shell command that writes ``text`` to ``path`` (no quoting trouble: base64)."""
    import base64

    return f"echo {base64.b64encode(text.encode()).decode()} | base64 -d > {path}"


@needs_cc
def test_a_preload_written_inside_regains_no_capability():
    with Sandbox(CONFIG) as box:
        built = box.run(f"{_write('/tmp/probe.c', PROBE_SO)} && gcc -shared -fPIC -o /tmp/probe.so /tmp/probe.c && echo built")
        assert built.output.strip().endswith("built"), built.output
        box.run("echo /tmp/probe.so > /etc/ld.so.preload")  # refused now (read-only); once it ran before the drop
        box.run("true")  # the next command's entry
        box.run("LD_PRELOAD=/tmp/probe.so /usr/bin/true")  # the probe, loaded by a command on purpose: its own rights
        log = box.run("cat /tmp/probe.log; cat /proc/sys/user/max_user_namespaces; mount -t tmpfs x /mnt; echo mount=$?")
    lines = log.output.splitlines()
    capabilities = [int(line.split()[1], 16) for line in lines if line.startswith("CapEff:")]
    assert capabilities, log.output  # the probe did run
    assert all(not cap & SYS_BIT_ADMIN for cap in capabilities), log.output  # never with CAP_SYS_ADMIN
    assert "mount=0" not in lines and "mount=-1" in lines, log.output  # the probe's mount, refused
    assert "0" in lines and lines[-1] == "mount=32"  # no nested user namespaces, no mount


def _session(evaluation: Script, config: SandboxConfig = CONFIG) -> OSSession:
    task = OSTask(task_id="os.adversarial", instruction="Create the user halo-ghost.", init=Script("mkdir -p /srv"),
                  evaluation=evaluation, solution=Script("useradd halo-ghost"))
    session = OSSession(task, config)
    session.start()
    return session


BASH_CHECK = Script("id halo-ghost")
PYTHON_CHECK = Script("import os, sys\nsys.exit(0 if os.path.exists('/srv/halo-solved') else 1)", "python")
# Each: the check, the commands, the outcome expected, and where the attack can be seen at work in the
# sandbox itself, a command and its output (what it does to the commands, it must not do to the check).
ATTACKS = {
    "solved (control)": (BASH_CHECK, ["useradd halo-ghost"], "correct", None),
    "solved, python (control)": (PYTHON_CHECK, ["touch /srv/halo-solved"], "correct", None),
    "preload": (BASH_CHECK, [f"{_write('/tmp/f.c', FORGE_SO)} && gcc -shared -fPIC -o /tmp/forge.so /tmp/f.c",
                             "echo /tmp/forge.so > /etc/ld.so.preload"], "incorrect", None),
    "fake loader": (BASH_CHECK, [f"mkdir /tmp/l64 && {_write('/tmp/l.c', FAKE_LOADER)} && "
                                 "gcc -nostdlib -static-pie -fPIE -o /tmp/l64/ld-linux-x86-64.so.2 /tmp/l.c && "
                                 "ln -s /tmp/l64 /tmp/lib64 && mv -T /tmp/lib64 /lib64"], "incorrect", ("id halo-ghost", "")),
    "usercustomize": (PYTHON_CHECK, ["d=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p $d && "
                                     "echo 'import os; os._exit(0)' > $d/usercustomize.py"], "incorrect",
                      ("python3 -c 'print(1)'", "")),
    "sitecustomize": (PYTHON_CHECK, ["for f in /etc/python3*/sitecustomize.py; do echo 'import os; os._exit(0)' > $f; done; "
                                     "echo 'import os; os._exit(0)' > /tmp/sitecustomize.py"], "incorrect", None),
}


@needs_cc
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_nothing_written_inside_forges_a_grade(attack):
    if attack == "fake loader" and platform.machine() != "x86_64":
        pytest.skip("the fake loader is written for x86_64")
    evaluation, commands, expected, at_work = ATTACKS[attack]
    session = _session(evaluation)
    try:
        for command in commands:
            session.run_command(command)
        if at_work is not None:  # the commands' own programs are fooled: `id halo-ghost` "passes" in the sandbox
            fooled = session.sandbox.run(at_work[0])
            assert (fooled.exit_code, fooled.output) == (0, at_work[1])
        assert session.evaluate("finished") == expected
        if expected == "incorrect":
            assert session.evaluation == "failed"  # the check ran, and found the task undone
    finally:
        session.close()


def test_nothing_left_running_acts_during_the_check():
    """A watcher left in the background waits for the check to start and then writes what it looks for
    (it could as well ptrace the check: same user, same capabilities): the check runs while it is frozen."""
    check = Script(": halo-check-marker; sleep 1; test -f /srv/halo-solved")
    session = _session(check)
    try:
        session.run_command("(while ! pgrep -f 'halo-check-mark[e]r' >/dev/null; do sleep 0.02; done; "
                            "touch /srv/halo-solved) > /dev/null 2>&1 & echo watching")
        assert session.evaluate("finished") == "incorrect"
        assert session.sandbox.run("pgrep -fc 'while ! pgrep'").output.strip() == "1"  # the watcher was there all along
    finally:
        session.close()


def test_a_check_stalled_on_a_fifo_or_a_fork_bomb_pays_no_more_than_a_wrong_answer():
    rewards = RewardMap()
    for stall in ("mkfifo /srv/answer", "mkfifo /srv/answer; :(){ :|:& };:"):
        session = _session(Script("grep -q yes /srv/answer"), SandboxConfig(timeout_s=1.0, max_processes=48))
        try:
            session.run_command(stall)
            outcome = session.evaluate("finished")
        finally:
            session.close()
        assert outcome == "incorrect" and rewards.reward(outcome) <= rewards.reward("incorrect")
        assert session.evaluation == "timed out"


KEYRING_PROBE = r"""
import ctypes, platform, sys
sys.path.insert(0, sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
keyctl, add_key = (250, 248) if platform.machine() == "x86_64" else (219, 217)
libc.syscall(keyctl, 1, b"halo-server-session")  # KEYCTL_JOIN_SESSION_KEYRING: the server's own, as from a login shell
key = libc.syscall(add_key, b"user", b"halo-secret", b"s3cret-halo-key", 15, -3)  # into KEY_SPEC_SESSION_KEYRING
assert key > 0, ctypes.get_errno()
from halo_agent.envs.os_sandbox import Sandbox, SandboxConfig
read = (f"import ctypes; l = ctypes.CDLL(None, use_errno=True); b = ctypes.create_string_buffer(64); "
        f"n = l.syscall({keyctl}, 11, {key}, b, 64); print('read', n, ctypes.get_errno(), b.raw[:max(n, 0)])")
with Sandbox(SandboxConfig(timeout_s=10)) as box:
    print(box.run(f"cat /proc/keys; python3 -c \"{read}\"").output)
"""


def test_the_server_keyring_is_out_of_reach():
    probe = subprocess.run([sys.executable, "-c", KEYRING_PROBE, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert "halo-secret" not in probe.stdout and "s3cret" not in probe.stdout, probe.stdout
    assert "read -1 1 " in probe.stdout  # keyctl refused (EPERM) by the seccomp filter


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / os.sysconf("SC_CLK_TCK")


def test_processes_left_spinning_spend_no_cpu_after_their_command_returns():
    with Sandbox(CONFIG) as box:
        assert box.run("for i in 1 2 3; do (while :; do :; done) & done; echo started").output == "started\n"
        procs = Path(box._cgroup.procs_files[0])
        pids = [int(p) for p in procs.read_text().split()]
        before = _cpu_seconds(pids)
        time.sleep(1.0)
        spent = _cpu_seconds(pids) - before
        assert spent < 0.1, f"{spent:.2f} CPU-s in 1 s after the command returned"
        assert box.run("pgrep -c bash").output.strip() != "0"  # still there (a task may need them), spinning again now


def test_a_sandbox_gets_its_cpu_quota_and_no_more():
    with Sandbox(SandboxConfig(timeout_s=10, cpus=0.2)) as box:
        quota = box._cgroup.dirs.get("") or box._cgroup.dirs.get("cpu")
        if quota is None or not ((quota / "cpu.max").exists() or (quota / "cpu.cfs_quota_us").exists()):
            pytest.skip("this host gives the process's cgroup no cpu controller (the sandbox warns so)")
        result = box.run("for i in 1 2; do (end=$((SECONDS + 2)); while [ $SECONDS -lt $end ]; do :; done) & done; wait; times")
    children = result.output.splitlines()[-1].split()  # `times`: the children's user and system time
    spent = sum(float(t.split("m")[0]) * 60 + float(t.split("m")[1].rstrip("s")) for t in children)
    wall = result.duration_ms / 1000
    assert spent <= 0.2 * wall * 1.5 + 0.1, f"{spent:.2f} CPU-s in {wall:.2f} s at a quota of 0.2 CPU"


def _alive(pid: int) -> bool:
    """Running (a zombie waits only for its parent to read its status)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------------------- through the server
@pytest.fixture(scope="module")
def server():
    base, process = start_server("--max-rounds", "3", "--timeout", "10")
    yield base, process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        process.wait(30)


def test_a_command_past_the_argument_limit_runs(server):
    task = LabTaskClient(server[0])
    session = new_session(task, "users-add")
    task.reset(session)
    session["chat_history"]["value"].append({"role": "agent", "content": bash("x=" + "a" * 200_000 + "; echo ${#x}")})
    task.interact(session)
    assert session["sample_status"] == "running"
    assert session["chat_history"]["value"][-1]["content"] == "The output of the OS:\n\n200000\n"
    task.release()


def test_two_requests_on_one_sample_at_once_run_one_and_refuse_the_other(server):
    task = LabTaskClient(server[0])
    session = new_session(task, "users-group-add")
    task.reset(session)
    session["chat_history"]["value"].append({"role": "agent", "content": bash("sleep 1; echo done")})
    answers: list[int] = []

    def interact() -> None:
        try:
            task._call("/interact", {"session": json.loads(json.dumps(session))})
            answers.append(200)
        except urllib.error.HTTPError as e:
            answers.append(e.code)

    threads = [threading.Thread(target=interact) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(answers) == [200, 409]
    task.release()


def test_sandboxes_of_a_server_killed_with_sigkill_are_gone_at_the_next_start(server):
    base, process = server
    task = LabTaskClient(base)
    task.reset(new_session(task, "files-make-dirs"))
    own = dict(line.split(":", 2)[1:] for line in Path(f"/proc/{process.pid}/cgroup").read_text().splitlines())
    places = [Path("/sys/fs/cgroup", controller, path.lstrip("/")) for controller, path in own.items() if controller in ("pids", "")]
    places += [place.parent for place in places if place.name == "halo-server"]  # v2: next to the server's leaf
    left = [folder for place in places for folder in place.glob(f"halo-sandbox-*-{process.pid}-*")]
    assert left  # the open sample's cgroups, named after the server
    pids = [int(p) for folder in left for p in (folder / "cgroup.procs").read_text().split()]
    assert pids  # its holder, at least
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    assert all(_alive(pid) for pid in pids)  # a SIGKILLed server closes nothing itself
    from halo_agent.envs.os_tasks import load_tasks
    from halo_agent.task_server import OSTaskService

    OSTaskService(load_tasks()[:1])  # the next server's start
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)]
    assert not [folder for folder in left if folder.exists()]
