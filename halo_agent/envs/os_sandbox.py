"""A throwaway Linux sandbox per sample, without docker: namespaces, an overlay root, cgroups and rlimits.

    with Sandbox(SandboxConfig()) as box:          # ~30-40 ms: a fresh root, no network
        box.run("useradd alice && id alice")       # CommandResult(exit_code=0, output=..., ...)
        box.run("sleep 999")                       # killed with its process group at the timeout

How one sandbox is built (``start``), as root:

- ``unshare`` makes new mount, PID, network, IPC and UTS namespaces. Its child (PID 1 of the new
  PID namespace, the *holder*) runs ``HOLDER_SCRIPT``: a tmpfs of ``disk_mb`` holds the overlay's
  upper layer, the lower layer is ``rootfs`` (the host's ``/`` by default, never written: every
  write lands in the tmpfs), folders of the host that hold data (``MASKED``: ``/work``, ``/root``,
  ``/home``, ``/tmp``, ...) are covered by empty tmpfs, ``/proc`` is the new namespace's own with
  ``/proc/sys`` read-only, ``/dev`` holds only ``null``, ``zero``, ``full``, ``random``,
  ``urandom`` and ``tty``, and ``pivot_root`` drops the host's root from the mount namespace, so
  no path inside leads out. The network namespace holds only a loopback that is down.
- Each command is its own ``bash -c`` entered into those namespaces with ``nsenter`` and started
  through ``setpriv`` with a reduced capability bounding set (no ``CAP_SYS_ADMIN``: no mount,
  no new namespace; no ``CAP_SYS_RESOURCE``: the limits below cannot be raised; no
  ``CAP_SYS_CHROOT``, ``CAP_SYS_PTRACE``, ``CAP_SYS_MODULE``, ``CAP_NET_ADMIN``, ...), a clean
  environment (nothing of the host's, API keys included), and rlimits: ``RLIMIT_CPU`` (CPU
  seconds), ``RLIMIT_AS`` (address space) and ``RLIMIT_FSIZE``. The holder and every command
  join a cgroup (v1 or v2, whichever the host offers) that caps the sandbox's processes
  (``pids.max``: a fork bomb stops there; root is exempt from ``RLIMIT_NPROC``, so the cgroup
  is what bounds processes) and memory. Where no cgroup can be made, a warning says so and
  the rlimits remain.
- A command gets ``timeout_s`` of wall time (20 s by default); then its whole process group is
  killed (background children included). Output (stdout and stderr together) is kept up to
  ``output_limit`` bytes, the rest is read and dropped, and a marker says how much was cut.
- ``close`` kills the holder: the kernel then kills every process left in the PID namespace,
  and the mounts (the tmpfs with everything written) vanish with the mount namespace.

Requires root, util-linux (``unshare``, ``nsenter``, ``setpriv``) and overlayfs; ``check_host``
says what is missing in one line. ``.ci/setup`` checks the same on a fresh machine.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import resource
import selectors
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

# Host folders that may hold data (the lake, checkouts, keys, temporary files): empty inside.
MASKED = ("work", "root", "home", "tmp", "var/tmp", "run", "mnt", "media", "srv", "farm", "old_root")
# Copied (cp -a makes the same device nodes), with the /dev/fd links.
DEVICES = tuple(f"/dev/{n}" for n in ("null", "zero", "full", "random", "urandom", "tty", "fd", "stdin", "stdout", "stderr"))
# Capabilities a command never has: the ones that would let it leave or reshape the sandbox.
DROPPED_CAPABILITIES = (
    "sys_admin", "sys_resource", "sys_chroot", "sys_ptrace", "sys_module", "sys_boot", "sys_time",
    "sys_rawio", "sys_pacct", "sys_tty_config", "net_admin", "net_raw", "mknod", "syslog", "mac_admin",
    "mac_override", "audit_control", "linux_immutable", "ipc_lock", "wake_alarm", "block_suspend",
    "bpf", "perfmon", "checkpoint_restore",
)
COMMAND_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "USER": "root",
    "LOGNAME": "root",
    "SHELL": "/bin/bash",
    "TERM": "dumb",
    "LANG": "C.UTF-8",
}
TRUNCATION_MARKER = "\n[... output truncated: {dropped} more bytes]"
READY = b"halo-sandbox-ready\n"
CLOSE_WAIT_S = 5.0  # for unshare to reap the killed holder and exit
DRAIN_S = 0.2  # the most time spent reading what a finished command's background children still write

HOLDER_SCRIPT = r"""
set -e
[ -n "$HALO_CGROUP_PROCS" ] && for f in $HALO_CGROUP_PROCS; do echo $$ > "$f"; done
echo sandbox > /proc/sys/kernel/hostname
mount -t tmpfs -o size=${HALO_DISK_MB}m,mode=755 halo-sandbox /run
mkdir /run/upper /run/work /run/root
# One mount(8) for the rest (each exec costs ~2 ms of a sandbox's start): the overlay, the
# masks, /proc with /proc/sys read-only, and an empty /dev.
{
  echo "overlay /run/root overlay lowerdir=$HALO_ROOTFS,upperdir=/run/upper,workdir=/run/work 0 0"
  for d in $HALO_MASKED; do
    [ -d "$HALO_ROOTFS/$d" ] && [ ! -L "$HALO_ROOTFS/$d" ] && echo "halo-empty /run/root/$d tmpfs size=${HALO_DISK_MB}m,mode=755 0 0"
  done
  echo "proc /run/root/proc proc defaults 0 0"
  echo "/run/root/proc/sys /run/root/proc/sys none bind,ro 0 0"
  echo "halo-dev /run/root/dev tmpfs size=1m,mode=755 0 0"
} > /run/fstab
mount --all --fstab /run/fstab
cd /run/root
chmod 1777 tmp
cp -a $HALO_DEVICES dev/
mkdir .halo-old-root
pivot_root . .halo-old-root
umount -l /.halo-old-root
rmdir /.halo-old-root
cd /
printf 'halo-sandbox-ready\n'
# PID 1 of the sandbox: bash reaps the orphans reparented to it (a killed background process
# must not linger as a zombie that looks alive to kill -0).
exec bash -c 'while :; do sleep 86400 & wait $!; done'
"""


class SandboxError(RuntimeError):
    """The sandbox could not be made or used (not root, a tool missing, the holder died)."""


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    timeout_s: float = 20.0  # wall time per command; then its process group is killed
    cpu_seconds: int = 10  # RLIMIT_CPU per process
    memory_mb: int = 512  # RLIMIT_AS per process, and the sandbox's cgroup memory limit
    max_processes: int = 64  # the sandbox's cgroup pids.max
    disk_mb: int = 256  # size of the tmpfs holding everything the sandbox writes
    output_limit: int = 8192  # bytes of a command's output kept; the rest is dropped with a marker
    rootfs: str = "/"  # the read-only lower layer of the sandbox's root
    start_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_seconds", "memory_mb", "max_processes", "disk_mb", "output_limit"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox {name} must be positive, got {getattr(self, name)}")
        if not os.path.isdir(self.rootfs):
            raise ValueError(f"sandbox rootfs {self.rootfs} is not a folder")


@dataclasses.dataclass
class CommandResult:
    exit_code: int | None  # None when the command was killed at its timeout
    output: str  # stdout and stderr together, truncated with a marker past output_limit
    timed_out: bool = False
    truncated: bool = False
    output_bytes: int = 0  # all the bytes the command wrote, kept or not
    duration_ms: float = 0.0


def check_host() -> None:
    """Raise ``SandboxError`` saying what this machine lacks for a sandbox."""
    if os.geteuid() != 0:
        raise SandboxError("the os sandbox needs root (namespaces, overlayfs and cgroups): run HALO as root")
    missing = [tool for tool in ("unshare", "nsenter", "setpriv", "bash") if shutil.which(tool) is None]
    if missing:
        raise SandboxError(f"the os sandbox needs {', '.join(missing)}: apt-get install util-linux bash")
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise SandboxError("the kernel offers no overlayfs (/proc/filesystems): run `modprobe overlay`")


class _Cgroup:
    """One cgroup per sandbox for its processes and memory (cgroup v2, or v1's pids and memory hierarchies)."""

    ROOT = Path("/sys/fs/cgroup")

    def __init__(self, name: str, max_processes: int, memory_bytes: int) -> None:
        self.dirs: list[Path] = []
        try:
            if (self.ROOT / "cgroup.controllers").exists():
                self._make(self.ROOT / name, {"pids.max": max_processes, "memory.max": memory_bytes})
            else:
                self._make(self.ROOT / "pids" / name, {"pids.max": max_processes})
                self._make(self.ROOT / "memory" / name, {"memory.limit_in_bytes": memory_bytes})
        except OSError as e:
            self.remove()
            _warn_once(f"no cgroup for the os sandbox ({e.strerror}: {e.filename}): processes and total memory are not capped, only rlimits apply")

    def _make(self, folder: Path, limits: dict[str, int]) -> None:
        folder.mkdir()
        self.dirs.append(folder)
        for key, value in limits.items():
            (folder / key).write_text(str(value))

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def remove(self) -> None:
        for folder in self.dirs:
            for _ in range(50):  # a cgroup can be removed once the kernel has reaped its last process
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
            else:
                log.warning("could not remove cgroup %s", folder)
        self.dirs = []


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


class Sandbox:
    """One sample's sandbox: ``start``, any number of ``run``, ``close`` (or use it as a context manager)."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.holder_pid: int | None = None
        self._unshare: subprocess.Popen | None = None
        self._cgroup: _Cgroup | None = None
        self.start_ms: float = 0.0

    def __enter__(self) -> "Sandbox":
        self.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        check_host()
        started = time.perf_counter()
        cfg = self.config
        self._cgroup = _Cgroup(f"halo-sandbox-{uuid.uuid4().hex[:12]}", cfg.max_processes, cfg.memory_mb * 1024 * 1024)
        env = {
            **COMMAND_ENV,
            "HALO_ROOTFS": cfg.rootfs,
            "HALO_DISK_MB": str(cfg.disk_mb),
            "HALO_MASKED": " ".join(MASKED),
            "HALO_DEVICES": " ".join(DEVICES),
            "HALO_CGROUP_PROCS": " ".join(self._cgroup.procs_files),
        }
        command = ["unshare", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child",
                   "--propagation", "private", "sh", "-c", HOLDER_SCRIPT]
        self._unshare = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=env, start_new_session=True)
        ready = self._wait_ready()
        if not ready:
            error = self._unshare.stderr.read().decode("utf-8", "replace").strip() if self._unshare.poll() is not None else "no answer"
            self.close()
            raise SandboxError(f"the sandbox did not start: {error.splitlines()[-1] if error else 'holder exited'}")
        self.holder_pid = self._find_holder()
        self.start_ms = (time.perf_counter() - started) * 1000.0

    def _wait_ready(self) -> bool:
        assert self._unshare is not None and self._unshare.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._unshare.stdout, selectors.EVENT_READ)
            if not sel.select(self.config.start_timeout_s):
                return False
        return self._unshare.stdout.readline() == READY

    def _find_holder(self) -> int:
        assert self._unshare is not None
        pid = self._unshare.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        if not children:  # kernels without CONFIG_PROC_CHILDREN: look for the process whose parent is unshare
            children = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _parent_of(p.name) == pid]
        if len(children) != 1:
            self.close()
            raise SandboxError(f"cannot find the sandbox's holder process (unshare {pid} has children {children})")
        return int(children[0])

    def close(self) -> None:
        # The holder first: unshare, its parent, reaps it and exits, so it leaves no zombie behind;
        # then unshare itself, should it not have exited.
        if self.holder_pid:
            _kill(self.holder_pid)
        if self._unshare is not None:
            try:
                self._unshare.wait(timeout=CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                _kill(self._unshare.pid)
                self._unshare.wait()
            for stream in (self._unshare.stdout, self._unshare.stderr):
                if stream is not None:
                    stream.close()
            self._unshare = None
        self.holder_pid = None
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None

    @property
    def alive(self) -> bool:
        return self.holder_pid is not None and self._unshare is not None and self._unshare.poll() is None

    # -------------------------------------------------------------------------------- commands
    def command_line(self, script: str, interpreter: str = "bash") -> list[str]:
        """The host command that runs ``script`` inside the sandbox (``bash -c`` or ``python3 -c``)."""
        if self.holder_pid is None:
            raise SandboxError("the sandbox is not started")
        inner = ["bash", "-c", script] if interpreter == "bash" else ["python3", "-c", script]
        caps = ",".join(f"-{c}" for c in DROPPED_CAPABILITIES)
        return ["nsenter", "-t", str(self.holder_pid), "-m", "-p", "-n", "-i", "-u", "-r", "-w",
                "setpriv", f"--bounding-set={caps}", "--", *inner]

    def run(self, script: str, timeout_s: float | None = None, interpreter: str = "bash") -> CommandResult:
        """Run one command in the sandbox; it cannot outlive ``timeout_s`` nor flood this process."""
        if not self.alive:
            raise SandboxError("the sandbox is gone (closed, or its holder was killed)")
        timeout = float(timeout_s if timeout_s is not None else self.config.timeout_s)
        started = time.perf_counter()
        proc = subprocess.Popen(
            self.command_line(script, interpreter), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, env=dict(COMMAND_ENV), cwd="/", start_new_session=True,
            preexec_fn=self._limit_child,
        )
        try:
            kept, total, timed_out = _read_bounded(proc, timeout, self.config.output_limit)
        finally:
            proc.stdout.close()
        if timed_out:
            _kill_group(proc.pid)
        exit_code = proc.wait()
        output = kept.decode("utf-8", "replace")
        truncated = total > len(kept)
        if truncated:
            output += TRUNCATION_MARKER.format(dropped=total - len(kept))
        return CommandResult(
            exit_code=None if timed_out else exit_code,
            output=output,
            timed_out=timed_out,
            truncated=truncated,
            output_bytes=total,
            duration_ms=(time.perf_counter() - started) * 1000.0,
        )

    def _limit_child(self) -> None:
        """In the forked child, before nsenter runs: rlimits, and the sandbox's cgroup."""
        cfg = self.config
        resource.setrlimit(resource.RLIMIT_CPU, (cfg.cpu_seconds, cfg.cpu_seconds))
        memory = cfg.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        disk = cfg.disk_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (disk, disk))
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg.max_processes, cfg.max_processes))
        for procs in (self._cgroup.procs_files if self._cgroup else ()):
            with open(procs, "w") as f:
                f.write(str(os.getpid()))


def _parent_of(pid: str) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _read_bounded(proc: subprocess.Popen, timeout: float, limit: int) -> tuple[bytes, int, bool]:
    """Read the command's output until it exits (or the timeout): at most ``limit`` bytes kept.

    Once the command itself has exited, only what is already in the pipe is read: a background
    child that keeps the pipe open (``sleep 100 &``) must not hold the caller up.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    deadline = time.monotonic() + timeout
    drain_until: float | None = None  # after the command exits, a short drain of what is left
    kept = bytearray()
    total = 0
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if drain_until is None and proc.poll() is not None:
                drain_until = now + DRAIN_S
            if drain_until is None and now >= deadline:
                return bytes(kept), total, True
            if drain_until is not None and now >= drain_until:
                break
            events = sel.select(0 if drain_until is not None else min(deadline - now, 0.05))
            if not events:
                if drain_until is not None:
                    break
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                break
            total += len(chunk)
            if len(kept) < limit:
                kept += chunk[: limit - len(kept)]
    return bytes(kept), total, False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
