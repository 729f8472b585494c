"""A throwaway Linux sandbox per sample, without docker: a user namespace, a root of its own, cgroups and rlimits.

    with Sandbox(SandboxConfig()) as box:          # a fresh root, no network, no host secrets
        box.run("useradd alice && id alice")       # CommandResult(exit_code=0, output=..., ...)
        box.run("sleep 999")                       # killed with its process group at the timeout
        box.evaluate("id alice")                   # a check from trusted tools, which no command can rewrite

Threat model. A command is written by a policy that is rewarded for passing evaluations, so it is
treated as hostile: it runs as root *inside* (it may install packages' files, add users, chmod, kill
its own processes, fill its disk, fork up to its limit, write anything in its root, /etc included)
and may try anything a root shell can. It may not: act on the host (files, processes, network,
devices, kernel settings, keys), regain the capabilities a command lacks, outlast its command's
wall time on the CPU, starve other sandboxes or the host beyond its limits, or change how the
evaluation runs (only what it checks). How each part is enforced:

- **Privilege.** ``unshare`` makes a new *user* namespace and, owned by it, new mount, PID, network,
  IPC and UTS namespaces. Root inside is an unprivileged id outside (``HOST_ID_BASE``..``+ID_COUNT-1``;
  ``cat /proc/self/uid_map`` inside shows ``0 1000000000 65536``), so host files owned by real root
  stay out of reach even where a mount shows them. The maps are written by the host
  (``unshare --map-users`` through the writer ``id_mapper`` makes). The namespace's own
  ``max_user_namespaces`` is 0: no nested user namespace (where a command would hold every
  capability again).
- **Entry.** Every process that runs inside is started by ``halo-sandbox-exec``
  (``os_sandbox_exec.c``), a *static* binary built once per host (``exec_helper``): it joins the
  sandbox's cgroups and a new anonymous session keyring, enters the namespaces (user first) and the
  root of the sandbox's PID 1, forks into the PID namespace, sets rlimits, installs a seccomp filter,
  drops the capability bounding set and the capability sets (no ``CAP_SYS_ADMIN``: no mount, no new
  namespace; no ``CAP_SYS_CHROOT``, ``CAP_SYS_PTRACE``, ``CAP_MKNOD``, ``CAP_SYS_RESOURCE``,
  ``CAP_DAC_READ_SEARCH``, ...), and only then executes the program by absolute path. Nothing the
  sandbox controls is loaded before the drop: a static binary reads no ``/etc/ld.so.preload``, no
  ``ld.so.cache`` and no ``/lib64`` loader, so a preload written inside runs, if at all, with a
  command's own reduced capabilities.
- **Loader configuration.** ``/etc`` is a mount point of its own (it cannot be moved aside), and
  ``ld.so.preload`` (empty), ``ld.so.cache``, ``ld.so.conf``, ``ld.so.conf.d``, ``nsswitch.conf`` and
  Python's ``/etc/python3*`` are read-only binds of the root template's copies: a command can read
  them, not change them.
- **Evaluation.** ``evaluate`` runs the task's check through the same helper in ``eval`` mode: in a
  mount namespace of its own whose root is built from trusted parts (the host's ``/usr`` read-only,
  the ``/bin``, ``/lib``, ``/lib64`` links as the template has them, the sandbox's ``/proc``, a ``/dev``
  of the genuine device nodes only) with every other entry of the sandbox's root bound at its place
  (its data: ``/etc``, ``/root``, ``/home``, ``/srv``, ``/tmp``, ...). Interpreters are the host's, by
  absolute path, in the clean environment (no ``LD_PRELOAD``, ``PYTHONPATH``, ``BASH_ENV``); Python
  runs with ``-I`` (no user site-packages, no ``PYTHON*`` variables). A check therefore reads what
  the commands left behind but runs no code of theirs. It runs in a cgroup of its own (its own
  process and CPU budget), and ``os_env`` scores a check that times out or cannot run as incorrect.
- **Keys.** The holder and every command get a new anonymous session keyring, and the seccomp
  filter refuses ``keyctl``, ``add_key`` and ``request_key`` (with ``bpf``, ``perf_event_open``,
  ``userfaultfd``, ``io_uring``, module loading, ``kexec``, ``unshare``, ``setns``, the mount API and
  other calls no task needs; another syscall ABI is killed).
- **Resources.** Each sandbox has a cgroup (``halo_agent.envs.os_cgroups``: v2, or v1's pids, memory, cpu and freezer hierarchies)
  *under the server's own cgroup*, so the server's limits bound its sandboxes: ``pids.max`` (a fork
  bomb stops there), memory, and a CPU quota (``cpus``: ``cpu.max`` or ``cpu.cfs_quota_us``). When a
  command returns, the sandbox's processes are frozen until the next command (background processes
  persist, as tasks may need them, but spend no CPU meanwhile), and they stay frozen through the
  evaluation: nothing a command left runs while the check does (it could otherwise rewrite what the
  check reads as it reads it, or ptrace the check: same user, same capabilities). rlimits:
  ``RLIMIT_CPU``, ``RLIMIT_AS``, ``RLIMIT_FSIZE``, ``RLIMIT_NPROC``. Where no cgroup can be made, a
  warning says so and the rlimits remain.
- **Time and output.** A command gets ``timeout_s`` of wall time (20 s by default); then its whole
  process group is killed. Output (stdout and stderr together) is kept up to ``output_limit`` bytes,
  the rest is read and dropped, and a marker says how much was cut. A script of any length is
  passed through a memory file, not the argument list.
- **Root.** The holder (PID 1 of the PID namespace, ``HOLDER_SCRIPT``, run from the host's root
  before ``pivot_root``, then the helper's static ``init``) mounts a tmpfs of ``disk_mb``
  for an overlay's upper layer over a *root template* made once per host (``root_template``): an
  ``/etc`` of the sandbox's own (accounts written for it, every password locked, with the host's
  non-secret configuration), empty ``/root``, ``/home``, ``/srv``, ``/tmp``, ``/var`` and ``/run``,
  and the host's ``/usr`` (and ``/bin``, ``/lib``, ... where they are not links into it) bound
  read-only. ``/proc`` is the PID namespace's own with ``/proc/sys`` read-only; ``/sys`` is
  read-only; ``/dev`` holds only ``null``, ``zero``, ``full``, ``random``, ``urandom`` and ``tty``;
  ``pivot_root`` drops the host's root. The network namespace holds only a loopback that is down.
  PID 1 reaps every orphan, so no zombie is left behind, and executes nothing after the start.
- **Lifetime.** ``close`` kills the holder: the kernel kills every process left in the PID
  namespace, and the mounts vanish with the mount namespace; the cgroups are removed. A sandbox's
  cgroups are named after the process that made it (its PID namespace, pid and start time): if that process dies
  without closing them (``SIGKILL``), the next sandbox made on the host (``reap_stale_sandboxes``, run
  once per process) kills what is left in them and removes them.

Requires root, util-linux 2.38 or later (``unshare --map-users``), user namespaces, overlayfs and a C
compiler with a static C library (``gcc``, ``libc6-dev``) for the helper; ``check_host`` says what is
missing in one line. ``.ci/setup`` installs and builds them on a fresh machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from halo_agent.envs.os_cgroups import _Cgroup, _cgroup_name, _kill, reap_stale_sandboxes

log = logging.getLogger(__name__)

# Root inside is this id outside (an id no host account has); the sandbox's ids 0..ID_COUNT-1 follow it.
HOST_ID_BASE = 1_000_000_000
ID_COUNT = 65536
# Where the host keeps the root template and the id map writers (made once, by content).
CACHE_DIR = Path(os.environ.get("HALO_SANDBOX_CACHE", "/var/cache/halo-sandbox"))
TEMPLATE_VERSION = "2"
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
# /etc entries that decide how programs load and what Python runs at start: read-only binds of the
# template's copies inside every sandbox (a command reads them, cannot change them).
ETC_LOCKED = ("ld.so.preload", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "python3", "python3.11",
              "python3.12", "python3.13")
# Capabilities a command never has: the ones that would let it leave or reshape the sandbox.
DROPPED_CAPABILITIES = (
    "sys_admin", "sys_resource", "sys_chroot", "sys_ptrace", "sys_module", "sys_boot", "sys_time",
    "sys_rawio", "sys_pacct", "sys_tty_config", "net_admin", "net_raw", "mknod", "syslog", "mac_admin",
    "mac_override", "audit_control", "linux_immutable", "ipc_lock", "wake_alarm", "block_suspend",
    "bpf", "perfmon", "checkpoint_restore", "dac_read_search",
)
# The kernel's capability numbers (linux/capability.h).
CAPABILITY_NUMBERS = {
    "chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3, "fsetid": 4, "kill": 5, "setgid": 6, "setuid": 7,
    "setpcap": 8, "linux_immutable": 9, "net_bind_service": 10, "net_broadcast": 11, "net_admin": 12, "net_raw": 13,
    "ipc_lock": 14, "ipc_owner": 15, "sys_module": 16, "sys_rawio": 17, "sys_chroot": 18, "sys_ptrace": 19,
    "sys_pacct": 20, "sys_admin": 21, "sys_boot": 22, "sys_nice": 23, "sys_resource": 24, "sys_time": 25,
    "sys_tty_config": 26, "mknod": 27, "lease": 28, "audit_write": 29, "audit_control": 30, "setfcap": 31,
    "mac_override": 32, "mac_admin": 33, "syslog": 34, "wake_alarm": 35, "block_suspend": 36, "audit_read": 37,
    "perfmon": 38, "bpf": 39, "checkpoint_restore": 40,
}
KEPT_CAPABILITIES = sum(1 << n for name, n in CAPABILITY_NUMBERS.items() if name not in DROPPED_CAPABILITIES)
HELPER_SOURCE = Path(__file__).resolve().parent / "os_sandbox_exec.c"
# A script longer than this goes to the interpreter through a memory file (one argument may hold 128 KiB).
ARGV_SCRIPT_LIMIT = 100_000
HELPER_FAILED = 125  # the helper's exit status when it could not enter the sandbox
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
exec 9< "$HALO_INIT"
hostname sandbox
# No user namespaces nested in this one (where a command would be root with every capability
# again): the limit is this namespace's own, and a command cannot raise it (no CAP_SYS_RESOURCE).
echo 0 > /proc/sys/user/max_user_namespaces
mount -t tmpfs -o size=${HALO_DISK_MB}m,mode=755 halo-sandbox /run
mkdir /run/upper /run/work /run/root
# One mount(8) for the rest (each exec costs ~2 ms of a sandbox's start): the overlay over the
# root template, the tools read-only, /proc with /proc/sys read-only, /sys read-only, the devices,
# /etc's locked entries.
{
  echo "overlay /run/root overlay lowerdir=$HALO_TEMPLATE,upperdir=/run/upper,workdir=/run/work 0 0"
  for d in $HALO_TOOL_DIRS; do echo "$HALO_ROOTFS/$d /run/root/$d none bind,ro 0 0"; done
  echo "proc /run/root/proc proc nosuid,nodev,noexec 0 0"
  echo "/run/root/proc/sys /run/root/proc/sys none bind,ro 0 0"
  echo "sysfs /run/root/sys sysfs ro,nosuid,nodev,noexec 0 0"
  for d in $HALO_DEVICES; do echo "/dev/$d /run/root/dev/$d none bind 0 0"; done
  # /etc a mount point of its own (it cannot be moved aside); the loader's and Python's start-up
  # configuration read-only binds of the template's copies.
  echo "/run/root/etc /run/root/etc none bind 0 0"
  for f in $HALO_ETC_LOCKED; do echo "$HALO_TEMPLATE/etc/$f /run/root/etc/$f none bind,ro 0 0"; done
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
# PID 1 of the sandbox: the static helper's init, opened before pivot_root (fd 9), reaps the orphans
# reparented to it (a killed background process must not linger as a zombie that looks alive to
# kill -0). It never executes anything again: no program of the sandbox's root runs with PID 1's
# capabilities once a command could have changed that root.
exec /proc/self/fd/9 init
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
    cpus: float = 1.0  # the sandbox's CPU quota (cgroup cpu.max), in CPUs
    rootfs: str = "/"  # the tree whose /usr (and /bin, /lib, ...) the sandbox's tools come from, read-only
    start_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_seconds", "memory_mb", "max_processes", "disk_mb", "output_limit", "cpus"):
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
    missing = [tool for tool in ("unshare", "bash", "hostname") if shutil.which(tool) is None]
    if missing:
        raise SandboxError(f"the os sandbox needs {', '.join(missing)}: apt-get install util-linux bash hostname")
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise SandboxError("the kernel offers no overlayfs (/proc/filesystems): run `modprobe overlay`")
    if not os.path.exists("/proc/self/ns/user"):
        raise SandboxError("the kernel offers no user namespaces (CONFIG_USER_NS): the os sandbox needs them")
    if "--map-users" not in _unshare_help():
        raise SandboxError("the os sandbox needs unshare --map-users: install util-linux 2.38 or later")
    exec_helper()


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
        "ld.so.preload": "",  # present, empty and read-only inside: the loader preloads nothing
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


_helper_lock = threading.Lock()


def exec_helper() -> Path:
    """The static ``halo-sandbox-exec`` (``os_sandbox_exec.c``), built once per host and source (``cc -static``)."""
    source = HELPER_SOURCE.read_bytes()
    path = CACHE_DIR / f"exec-{hashlib.sha256(source).hexdigest()[:16]}" / "halo-sandbox-exec"
    if path.exists():
        return path
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SandboxError("the os sandbox builds a small static helper: apt-get install gcc libc6-dev")
    with _helper_lock:
        CACHE_DIR.mkdir(parents=True, exist_ok=True, mode=0o755)
        build = Path(tempfile.mkdtemp(prefix=".exec-", dir=CACHE_DIR))
        built = subprocess.run([compiler, "-O2", "-static", "-o", str(build / path.name), str(HELPER_SOURCE)],
                               capture_output=True, text=True)
        if built.returncode != 0:
            shutil.rmtree(build, ignore_errors=True)
            lines = [line for line in built.stderr.splitlines() if "error" in line] or built.stderr.splitlines() or ["no output"]
            raise SandboxError(f"cannot build the os sandbox's static helper ({lines[0].strip()}): apt-get install gcc libc6-dev")
        os.chmod(build, 0o755)
        try:
            os.rename(build, path.parent)
        except OSError:  # built meanwhile by another process: keep theirs
            shutil.rmtree(build, ignore_errors=True)
    return path


def _tool_path(rootfs: str, name: str) -> str:
    """The absolute path, inside, of one of the host's interpreters (``bash``, ``python3``)."""
    for folder in ("/usr/bin", "/bin", "/usr/local/bin"):
        if os.path.exists(f"{rootfs.rstrip('/')}{folder}/{name}"):
            return f"{folder}/{name}"
    raise SandboxError(f"the os sandbox's rootfs {rootfs} has no {name}")


class Sandbox:
    """One sample's sandbox: ``start``, any number of ``run``, ``evaluate``, ``close`` (or use it as a context manager)."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.holder_pid: int | None = None
        self._unshare: subprocess.Popen | None = None
        self._cgroup: _Cgroup | None = None
        self._eval_cgroup: _Cgroup | None = None
        self._template: Path | None = None
        self.start_ms: float = 0.0

    def __enter__(self) -> "Sandbox":
        self.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        check_host()
        reap_stale_sandboxes()
        started = time.perf_counter()
        cfg = self.config
        name = _cgroup_name()
        memory = cfg.memory_mb * 1024 * 1024
        self._cgroup = _Cgroup(name, cfg.max_processes, memory, cfg.cpus)
        self._eval_cgroup = _Cgroup(name + "-eval", cfg.max_processes, memory, cfg.cpus)
        self._template = template = root_template(cfg.rootfs)
        mapper = id_mapper()
        env = {
            **COMMAND_ENV,
            "PATH": f"{mapper}:{COMMAND_ENV['PATH']}",
            "HALO_ROOTFS": cfg.rootfs.rstrip("/"),
            "HALO_TEMPLATE": str(template),
            "HALO_DISK_MB": str(cfg.disk_mb),
            "HALO_TOOL_DIRS": " ".join(self._tool_binds()),
            "HALO_DEVICES": " ".join(DEVICES),
            "HALO_ETC_LOCKED": " ".join(f for f in ETC_LOCKED if os.path.lexists(template / "etc" / f)),
            "HALO_INIT": str(exec_helper()),
        }
        ids = f"{HOST_ID_BASE},0,{ID_COUNT}"
        command = [str(exec_helper()), "spawn", *self._cgroup_options(self._cgroup), "--",
                   shutil.which("unshare") or "/usr/bin/unshare", f"--map-users={ids}", "--setuid", "0", "--setgid", "0",
                   "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child",
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

    def _tool_binds(self) -> list[str]:
        template = self._template
        assert template is not None
        return [d for d in TOOL_DIRS if (template / d).is_dir() and not (template / d).is_symlink()]

    @staticmethod
    def _cgroup_options(cgroup: _Cgroup | None) -> list[str]:
        return [option for procs in (cgroup.procs_files if cgroup else ()) for option in ("--cgroup", procs)]

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
        # Thawed first (a frozen process waits to die); then the holder: unshare, its parent, reaps it
        # and exits, so it leaves no zombie behind; then unshare itself, should it not have exited.
        for cgroup in (self._cgroup, self._eval_cgroup):
            if cgroup is not None:
                cgroup.freeze(False)
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
        for cgroup in (self._cgroup, self._eval_cgroup):
            if cgroup is not None:
                cgroup.kill_all()  # what an evaluation or a command's helper left, if anything
                cgroup.remove()
        self._cgroup = self._eval_cgroup = None

    @property
    def alive(self) -> bool:
        return self.holder_pid is not None and self._unshare is not None and self._unshare.poll() is None

    # -------------------------------------------------------------------------------- commands
    def command_line(self, script: str, interpreter: str = "bash", mode: str = "run", script_fd: int | None = None) -> list[str]:
        """The host command that runs ``script`` inside the sandbox (``bash -c`` or ``python3 -c``).

        ``mode`` ``eval`` runs it in the trusted root, Python isolated (``-I``); ``script_fd`` passes
        the script as that open file instead of an argument."""
        if self.holder_pid is None:
            raise SandboxError("the sandbox is not started")
        cfg = self.config
        program = _tool_path(cfg.rootfs, "bash" if interpreter == "bash" else "python3")
        flags = ["-I"] if interpreter != "bash" and mode == "eval" else []
        inner = [program, *flags, *([f"/proc/self/fd/{script_fd}"] if script_fd is not None else ["-c", script])]
        memory, disk = cfg.memory_mb * 1024 * 1024, cfg.disk_mb * 1024 * 1024
        options = ["--pid", str(self.holder_pid), "--keep-caps", f"{KEPT_CAPABILITIES:x}",
                   "--rlimit", f"{cfg.cpu_seconds},{memory},{disk},{cfg.max_processes}",
                   *self._cgroup_options(self._eval_cgroup if mode == "eval" else self._cgroup)]
        if mode == "eval":
            template = self._template
            assert template is not None
            for name in TOOL_DIRS:
                if (template / name).is_symlink():
                    options += ["--link", f"{name}={os.readlink(template / name)}"]
            options += [option for name in self._tool_binds() for option in ("--bind", name)]
        return [str(exec_helper()), mode, *options, "--", *inner]

    def run(self, script: str, timeout_s: float | None = None, interpreter: str = "bash") -> CommandResult:
        """Run one command in the sandbox; it cannot outlive ``timeout_s`` nor flood this process.

        The sandbox's processes run while it runs; when it returns they are frozen until the next."""
        return self._execute(script, timeout_s, interpreter, "run")

    def evaluate(self, script: str, timeout_s: float | None = None, interpreter: str = "bash") -> CommandResult:
        """Run a check from trusted tools (the host's interpreters and loader, the sandbox's data only),
        while every process the commands left stays frozen."""
        return self._execute(script, timeout_s, interpreter, "eval")

    def _execute(self, script: str, timeout_s: float | None, interpreter: str, mode: str) -> CommandResult:
        if not self.alive:
            raise SandboxError("the sandbox is gone (closed, or its holder was killed)")
        timeout = float(timeout_s if timeout_s is not None else self.config.timeout_s)
        encoded = script.encode("utf-8", "surrogateescape")
        script_fd = None
        if len(encoded) > ARGV_SCRIPT_LIMIT:  # past what one argument may hold: a memory file
            script_fd = os.memfd_create("halo-script", 0)
            os.write(script_fd, encoded)
            os.lseek(script_fd, 0, os.SEEK_SET)
        if self._cgroup is not None:
            # A command runs along with what earlier ones left running; a check runs while all of it stays
            # frozen: nothing a command left can change the state under the check, signal or ptrace it.
            self._cgroup.freeze(mode == "eval")
        started = time.perf_counter()
        try:
            proc = subprocess.Popen(
                self.command_line(script, interpreter, mode, script_fd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=dict(COMMAND_ENV), cwd="/", start_new_session=True,
                pass_fds=(script_fd,) if script_fd is not None else (),
            )
        finally:
            if script_fd is not None:
                os.close(script_fd)
        try:
            kept, total, timed_out = _read_bounded(proc, timeout, self.config.output_limit)
        finally:
            proc.stdout.close()
        if timed_out:
            _kill_group(proc.pid)
        exit_code = proc.wait()
        if mode == "run" and self._cgroup is not None:
            self._cgroup.freeze(True)  # what it left running spends no CPU until the next command
        if mode == "eval" and self._eval_cgroup is not None:
            self._eval_cgroup.kill_all()  # a check leaves nothing behind
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


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
