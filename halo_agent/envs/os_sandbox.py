"""A throwaway Linux sandbox per sample, without docker: a user namespace, a root of its own, cgroups and rlimits.

    with Sandbox(SandboxConfig()) as box:          # ~35-45 ms: a fresh root, no network, no host secrets
        box.run("useradd alice && id alice")       # CommandResult(exit_code=0, output=..., ...)
        box.run("sleep 999")                       # killed with its process group at the timeout

How one sandbox is built (``start``), as root on the host:

- ``unshare`` makes a new *user* namespace and, owned by it, new mount, PID, network, IPC and UTS
  namespaces. Root inside is mapped to an unprivileged range outside (ids ``HOST_ID_BASE`` to
  ``HOST_ID_BASE + ID_COUNT - 1``; ``cat /proc/self/uid_map`` inside shows ``0 1000000000 65536``),
  so what root may do inside is bounded by what that unprivileged id may do on the host: host
  files owned by real root are ``nobody``'s inside, and a file only real root may read (the
  host's ``/etc/shadow``, ``/root``) stays unreadable even through a mount that shows it. The maps
  are written by the host (``unshare --map-users``, through the writer ``id_mapper`` makes).
- Its child (PID 1 of the new PID namespace, the *holder*) runs ``HOLDER_SCRIPT``: a tmpfs of
  ``disk_mb`` holds an overlay's upper layer; the lower layer is a *root template* made once per
  host (``root_template``): an ``/etc`` of the sandbox's own (``passwd``, ``group``, ``shadow`` and
  ``gshadow`` written for it, with the host's non-secret configuration: ``login.defs``, PAM, the
  alternatives, the loader cache, ...), empty ``/root``, ``/home``, ``/srv``, ``/tmp``, ``/var`` and
  ``/run``, and the host's ``/usr`` (and ``/bin``, ``/lib``, ... where they are not links into it)
  bound read-only: the tools, nothing else of the host (no ``/opt``, ``/work``, host ``/var``).
  ``/proc`` is the PID namespace's own, with ``/proc/sys`` read-only; ``/sys`` is the network
  namespace's own, read-only; ``/dev`` holds only ``null``, ``zero``, ``full``, ``random``,
  ``urandom`` and ``tty``; ``pivot_root`` then drops the host's root from the mount namespace, so
  no path inside leads out. The network namespace holds only a loopback that is down.
- PID 1 stays a small init: it reaps every orphan reparented to it, so a background process that
  exits or is killed leaves no zombie behind. The user namespace's own ``max_user_namespaces`` is
  0, so no command makes a nested one (in which it would hold every capability again).
- Each command is its own ``bash -c`` entered into those namespaces with ``nsenter`` and started
  through ``setpriv`` with a reduced capability bounding set (inside the user namespace: no
  ``CAP_SYS_ADMIN``: no mount, no new namespace; no ``CAP_SYS_CHROOT``, ``CAP_SYS_PTRACE``,
  ``CAP_MKNOD``, ``CAP_SYS_RESOURCE``, ...), a clean environment (nothing of the host's, API keys
  included), and rlimits: ``RLIMIT_CPU`` (CPU seconds), ``RLIMIT_AS`` (address space),
  ``RLIMIT_FSIZE`` and ``RLIMIT_NPROC``. The holder and every command join a cgroup (v1 or v2,
  whichever the host offers) that caps the sandbox's processes (``pids.max``: a fork bomb stops
  there) and memory. Where no cgroup can be made, a warning says so and the rlimits remain.
- A command gets ``timeout_s`` of wall time (20 s by default); then its whole process group is
  killed (background children included). Output (stdout and stderr together) is kept up to
  ``output_limit`` bytes, the rest is read and dropped, and a marker says how much was cut.
- ``close`` kills the holder: the kernel then kills every process left in the PID namespace,
  and the mounts (the tmpfs with everything written) vanish with the mount namespace.

Requires root, util-linux 2.38 or later (``unshare --map-users``, ``nsenter``, ``setpriv``),
user namespaces and overlayfs; ``check_host`` says what is missing in one line. ``.ci/setup``
checks the same on a fresh machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import resource
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

# Root inside is this id outside (an id no host account has); the sandbox's ids 0..ID_COUNT-1 follow it.
HOST_ID_BASE = 1_000_000_000
ID_COUNT = 65536
# Where the host keeps the root template and the id map writers (made once, by content).
CACHE_DIR = Path(os.environ.get("HALO_SANDBOX_CACHE", "/var/cache/halo-sandbox"))
TEMPLATE_VERSION = "1"
# Top-level folders of the host's root that hold the tools: bound read-only, or the same link.
TOOL_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# The host's /etc entries the sandbox's /etc copies: configuration the tools read, no secrets.
ETC_COPIED = (
    "adduser.conf", "alternatives", "bash.bashrc", "debian_version", "default", "deluser.conf", "ethertypes",
    "gai.conf", "host.conf", "inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "locale.alias", "localtime",
    "login.defs", "magic", "magic.mime", "mime.types", "networks", "os-release", "pam.conf", "pam.d", "profile",
    "profile.d", "protocols", "python3", "python3.11", "security", "services", "shells", "skel", "terminfo",
    "timezone", "xattr.conf",
)
ETC_SKIPPED = ("security/opasswd",)  # old password hashes
# The sandbox's accounts (Debian's base set); every password locked.
SANDBOX_USERS = (
    ("root", 0, 0, "root", "/root", "/bin/bash"), ("daemon", 1, 1, "daemon", "/usr/sbin", "/usr/sbin/nologin"),
    ("bin", 2, 2, "bin", "/bin", "/usr/sbin/nologin"), ("sys", 3, 3, "sys", "/dev", "/usr/sbin/nologin"),
    ("sync", 4, 65534, "sync", "/bin", "/bin/sync"), ("games", 5, 60, "games", "/usr/games", "/usr/sbin/nologin"),
    ("man", 6, 12, "man", "/var/cache/man", "/usr/sbin/nologin"), ("lp", 7, 7, "lp", "/var/spool/lpd", "/usr/sbin/nologin"),
    ("mail", 8, 8, "mail", "/var/mail", "/usr/sbin/nologin"), ("news", 9, 9, "news", "/var/spool/news", "/usr/sbin/nologin"),
    ("www-data", 33, 33, "www-data", "/var/www", "/usr/sbin/nologin"),
    ("nobody", 65534, 65534, "nobody", "/nonexistent", "/usr/sbin/nologin"),
)
SANDBOX_GROUPS = (
    ("root", 0), ("daemon", 1), ("bin", 2), ("sys", 3), ("adm", 4), ("tty", 5), ("disk", 6), ("lp", 7), ("mail", 8),
    ("news", 9), ("man", 12), ("kmem", 15), ("sudo", 27), ("audio", 29), ("www-data", 33), ("shadow", 42),
    ("utmp", 43), ("video", 44), ("plugdev", 46), ("staff", 50), ("games", 60), ("users", 100), ("nogroup", 65534),
)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# Capabilities a command never has: the ones that would let it leave or reshape the sandbox.
DROPPED_CAPABILITIES = (
    "sys_admin", "sys_resource", "sys_chroot", "sys_ptrace", "sys_module", "sys_boot", "sys_time",
    "sys_rawio", "sys_pacct", "sys_tty_config", "net_admin", "net_raw", "mknod", "syslog", "mac_admin",
    "mac_override", "audit_control", "linux_immutable", "ipc_lock", "wake_alarm", "block_suspend",
    "bpf", "perfmon", "checkpoint_restore", "dac_read_search",
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

# unshare --map-users runs this by name (as newuidmap PID INNER OUTER COUNT): the host, root,
# writes the range for the user ids and the same for the group ids (so no newgidmap run and no
# setuid helper are needed).
ID_MAPPER = """#!/bin/sh
printf '%s %s %s\\n' "$2" "$3" "$4" > /proc/"$1"/uid_map
printf '%s %s %s\\n' "$2" "$3" "$4" > /proc/"$1"/gid_map
"""

HOLDER_SCRIPT = r"""
set -e
hostname sandbox
# No user namespaces nested in this one (where a command would be root with every capability
# again): the limit is this namespace's own, and a command cannot raise it (no CAP_SYS_RESOURCE).
echo 0 > /proc/sys/user/max_user_namespaces
mount -t tmpfs -o size=${HALO_DISK_MB}m,mode=755 halo-sandbox /run
mkdir /run/upper /run/work /run/root
# One mount(8) for the rest (each exec costs ~2 ms of a sandbox's start): the overlay over the
# root template, the tools read-only, /proc with /proc/sys read-only, /sys read-only, the devices.
{
  echo "overlay /run/root overlay lowerdir=$HALO_TEMPLATE,upperdir=/run/upper,workdir=/run/work 0 0"
  for d in $HALO_TOOL_DIRS; do echo "$HALO_ROOTFS/$d /run/root/$d none bind,ro 0 0"; done
  echo "proc /run/root/proc proc nosuid,nodev,noexec 0 0"
  echo "/run/root/proc/sys /run/root/proc/sys none bind,ro 0 0"
  echo "sysfs /run/root/sys sysfs ro,nosuid,nodev,noexec 0 0"
  for d in $HALO_DEVICES; do echo "/dev/$d /run/root/dev/$d none bind 0 0"; done
} > /run/fstab
mount --all --fstab /run/fstab
# pivot_root with new and old root the same folder stacks the host's root under the new one;
# the lazy unmount of "." then drops it (no folder for the old root to make and remove).
cd /run/root
pivot_root . .
umount -l .
cd /
printf 'halo-sandbox-ready
'
# PID 1 of the sandbox: bash reaps the orphans reparented to it (a killed background process
# must not linger as a zombie that looks alive to kill -0).
exec bash -c 'trap "" TERM INT HUP; while :; do sleep 86400 & wait $!; done'
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
    rootfs: str = "/"  # the tree whose /usr (and /bin, /lib, ...) the sandbox's tools come from, read-only
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
    missing = [tool for tool in ("unshare", "nsenter", "setpriv", "bash", "hostname") if shutil.which(tool) is None]
    if missing:
        raise SandboxError(f"the os sandbox needs {', '.join(missing)}: apt-get install util-linux bash hostname")
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise SandboxError("the kernel offers no overlayfs (/proc/filesystems): run `modprobe overlay`")
    if not os.path.exists("/proc/self/ns/user"):
        raise SandboxError("the kernel offers no user namespaces (CONFIG_USER_NS): the os sandbox needs them")
    if "--map-users" not in _unshare_help():
        raise SandboxError("the os sandbox needs unshare --map-users: install util-linux 2.38 or later")


_help_cache: list[str] = []


def _unshare_help() -> str:
    if not _help_cache:
        _help_cache.append(subprocess.run(["unshare", "--help"], capture_output=True, text=True).stdout)
    return _help_cache[0]


def _write_files(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).write_text(text)


def _accounts() -> dict[str, str]:
    """passwd, group, shadow and gshadow for the sandbox: Debian's base accounts, every password locked."""
    return {
        "passwd": "".join(f"{n}:x:{u}:{g}:{c}:{h}:{sh}\n" for n, u, g, c, h, sh in SANDBOX_USERS),
        "shadow": "".join(f"{n}:*:19000:0:99999:7:::\n" for n, *_ in SANDBOX_USERS),
        "group": "".join(f"{n}:x:{g}:\n" for n, g in SANDBOX_GROUPS),
        "gshadow": "".join(f"{n}:*::\n" for n, _ in SANDBOX_GROUPS),
        "hostname": "sandbox\n",
        "hosts": "127.0.0.1 localhost\n127.0.1.1 sandbox\n::1 localhost ip6-localhost ip6-loopback\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\ngshadow: files\nhosts: files\n",
        "resolv.conf": "",
        "subuid": "",
        "subgid": "",
    }


def _template_key(rootfs: str) -> str:
    digest = hashlib.sha256(repr((TEMPLATE_VERSION, rootfs, ID_MAPPER, ID_COUNT, HOST_ID_BASE, ETC_COPIED, SANDBOX_USERS, SANDBOX_GROUPS,
                                  DEVICES, TOOL_DIRS)).encode()).hexdigest()
    return digest[:16]


def root_template(rootfs: str = "/") -> Path:
    """The lower layer of every sandbox's root (made once per host and ``rootfs``, then reused).

    Owned by the id that is root inside, so an overlay copies its files up as root's. The tool
    folders are empty mount points (bound read-only at start) or the host's own links into ``/usr``.
    """
    CACHE_DIR.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = CACHE_DIR / f"root-{_template_key(rootfs)}"
    if path.is_dir():
        return path
    build = Path(tempfile.mkdtemp(prefix=".root-", dir=CACHE_DIR))
    os.chmod(build, 0o755)
    for folder in ("etc", "root", "home", "srv", "tmp", "run", "mnt", "proc", "sys", "dev",
                   "var/tmp", "var/log", "var/mail", "var/spool", "var/lib", "var/cache", "var/local", "var/opt"):
        (build / folder).mkdir(parents=True, exist_ok=True)
    os.chmod(build / "root", 0o700)
    os.chmod(build / "tmp", 0o1777)
    os.chmod(build / "var/tmp", 0o1777)
    os.symlink("../run", build / "var/run")
    for name in TOOL_DIRS:
        host = Path(rootfs) / name
        if host.is_symlink():
            os.symlink(os.readlink(host), build / name)
        elif host.is_dir():
            (build / name).mkdir()
    etc = Path(rootfs) / "etc"
    for name in ETC_COPIED:
        source = etc / name
        if source.is_symlink():
            os.symlink(os.readlink(source), build / "etc" / name)
        elif source.is_dir():
            shutil.copytree(source, build / "etc" / name, symlinks=True,
                            ignore=lambda d, names: [n for n in names if os.path.relpath(os.path.join(d, n), etc) in ETC_SKIPPED])
        elif source.is_file():
            shutil.copy2(source, build / "etc" / name)
    _write_files(build / "etc", _accounts())
    os.chmod(build / "etc/shadow", 0o640)
    os.chmod(build / "etc/gshadow", 0o640)
    os.symlink("../proc/self/mounts", build / "etc/mtab")
    for device in DEVICES:
        (build / "dev" / device).touch()  # mount points for the host's device nodes
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(target, build / "dev" / name)
    for folder, dirs, files in os.walk(build):
        for name in (folder, *(os.path.join(folder, n) for n in dirs + files)):
            os.lchown(name, HOST_ID_BASE, HOST_ID_BASE + (42 if name.endswith(("etc/shadow", "etc/gshadow")) else 0))
    try:
        os.rename(build, path)
    except OSError:  # made meanwhile by another process: keep theirs
        shutil.rmtree(build, ignore_errors=True)
    return path


def id_mapper() -> Path:
    """A folder holding the ``newuidmap`` that ``unshare --map-users`` runs (made once per host)."""
    folder = CACHE_DIR / f"bin-{_template_key('')}"
    if (folder / "newuidmap").exists():
        return folder
    build = Path(tempfile.mkdtemp(prefix=".bin-", dir=CACHE_DIR))
    (build / "newuidmap").write_text(ID_MAPPER)
    (build / "newuidmap").chmod(0o755)
    os.chmod(build, 0o755)
    try:
        os.rename(build, folder)
    except OSError:  # made meanwhile by another process: keep theirs
        shutil.rmtree(build, ignore_errors=True)
    return folder


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
        template, mapper = root_template(cfg.rootfs), id_mapper()
        env = {
            **COMMAND_ENV,
            "PATH": f"{mapper}:{COMMAND_ENV['PATH']}",
            "HALO_ROOTFS": cfg.rootfs.rstrip("/"),
            "HALO_TEMPLATE": str(template),
            "HALO_DISK_MB": str(cfg.disk_mb),
            "HALO_TOOL_DIRS": " ".join(d for d in TOOL_DIRS if (template / d).is_dir() and not (template / d).is_symlink()),
            "HALO_DEVICES": " ".join(DEVICES),
        }
        ids = f"{HOST_ID_BASE},0,{ID_COUNT}"
        command = ["unshare", f"--map-users={ids}", "--setuid", "0", "--setgid", "0",
                   "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child",
                   "--propagation", "private", "sh", "-c", HOLDER_SCRIPT]
        self._unshare = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=env, start_new_session=True,
                                         preexec_fn=self._join_cgroup)
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
        return ["nsenter", "-t", str(self.holder_pid), "-U", "-m", "-p", "-n", "-i", "-u", "-r", "-w",
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
        self._join_cgroup()

    def _join_cgroup(self) -> None:
        """In a forked child, on the host's side: join the sandbox's cgroup (inside, its files are not root's)."""
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
