"""The os sandbox's cgroups: one per sandbox (and one per evaluation) under this process's own, with a CPU
quota, a pids and memory limit, freezing between commands, and the clean-up of sandboxes a killed process left.

Used by ``halo_agent.envs.os_sandbox``, whose docstring states the threat model; cgroup v1 (a folder per
controller) and v2 (one unified folder, controllers delegated to a leaf beside this process) alike.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import threading
import time
import uuid
from pathlib import Path

log = logging.getLogger("halo_agent.envs.os_sandbox")

FREEZE_WAIT_S = 0.5


CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PREFIX = "halo-sandbox-"
V1_CONTROLLERS = ("pids", "memory", "cpu", "freezer")
V2_CONTROLLERS = ("pids", "memory", "cpu")
V2_SERVER_LEAF = "halo-server"
CPU_PERIOD_US = 100_000
_STALE_NAME = re.compile(rf"^{CGROUP_PREFIX}(\d+)-(\d+)-(\d+)-[0-9a-f]+(-eval)?$")  # pid namespace, pid, start


def _process_start(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), which tells it from a later process with its pid."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per v1 controller, or under ``""`` its cgroup v2 path."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def _cgroup_v2() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").exists()


_v2_parent: list[Path] = []


def _cgroup_parents() -> dict[str, Path]:
    """Where this process's sandboxes' cgroups go: under its own cgroup, per hierarchy (``""`` for v2)."""
    own = _own_cgroups()
    if _cgroup_v2():
        own_v2 = CGROUP_ROOT / own.get("", "/").lstrip("/")
        # a leaf an earlier HALO process made for its cgroup's processes: the sandboxes go next to it
        return {"": _v2_delegated_parent(own_v2.parent if own_v2.name == V2_SERVER_LEAF else own_v2)}
    return {c: CGROUP_ROOT / c / own[c].lstrip("/") for c in V1_CONTROLLERS if c in own and (CGROUP_ROOT / c).is_dir()}


def _v2_delegated_parent(parent: Path) -> Path:
    """The server's own v2 cgroup, with pids, memory and cpu enabled for its children.

    A v2 cgroup with processes cannot hand controllers to children (unless it is the root): its
    processes (this one and those it shares the cgroup with) then move into a leaf ``halo-server``
    of it first, once; they stay under the same limits, and a process started there later puts its
    sandboxes next to that leaf too."""
    if _v2_parent:
        return _v2_parent[0]
    available = set((parent / "cgroup.controllers").read_text().split())
    wanted = [c for c in V2_CONTROLLERS if c in available]
    try:
        _enable(parent, wanted)
    except OSError as e:
        if e.errno != errno.EBUSY or parent == CGROUP_ROOT:
            raise
        leaf = parent / V2_SERVER_LEAF
        leaf.mkdir(exist_ok=True)
        for pid in (parent / "cgroup.procs").read_text().split():
            try:
                (leaf / "cgroup.procs").write_text(pid)
            except ProcessLookupError:  # exited meanwhile
                pass
        _enable(parent, wanted)
    missing = [c for c in V2_CONTROLLERS if c not in available]
    if missing:
        _warn_once(f"cgroup {parent} is not given the {', '.join(missing)} controller(s): the os sandbox cannot cap them there")
    _v2_parent.append(parent)
    return parent


def _enable(parent: Path, controllers: list[str]) -> None:
    enabled = set((parent / "cgroup.subtree_control").read_text().split())
    missing = [c for c in controllers if c not in enabled]
    if missing:
        (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))


class _Cgroup:
    """One cgroup (v2, or one per v1 hierarchy) under the server's own: processes, memory, CPU, freezing."""

    def __init__(self, name: str, max_processes: int, memory_bytes: int, cpus: float) -> None:
        self.name = name
        self.dirs: dict[str, Path] = {}  # hierarchy ("" for v2) -> folder
        self.frozen = False
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        try:
            for hierarchy, parent in _cgroup_parents().items():
                limits = {
                    "": {"pids.max": max_processes, "memory.max": memory_bytes, "cpu.max": f"{quota} {CPU_PERIOD_US}"},
                    "pids": {"pids.max": max_processes}, "memory": {"memory.limit_in_bytes": memory_bytes},
                    "cpu": {"cpu.cfs_period_us": CPU_PERIOD_US, "cpu.cfs_quota_us": quota}, "freezer": {},
                }[hierarchy]
                self._make(hierarchy, parent / name, limits)
        except OSError as e:
            self.remove()
            _warn_once(f"no cgroup for the os sandbox ({e.strerror}: {e.filename}): processes, memory and CPU are not capped, "
                       "only rlimits apply")

    @classmethod
    def existing(cls, name: str, dirs: dict[str, Path]) -> "_Cgroup":
        """A cgroup made earlier (by another process), to kill and remove; taken as frozen, so it is thawed first."""
        group = cls.__new__(cls)
        group.name, group.dirs, group.frozen = name, dict(dirs), True
        return group

    def _make(self, hierarchy: str, folder: Path, limits: dict[str, object]) -> None:
        folder.mkdir()
        self.dirs[hierarchy] = folder
        for key, value in limits.items():
            if (folder / key).exists():  # a v2 controller the parent does not offer has no files
                (folder / key).write_text(str(value))

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def pids(self) -> list[int]:
        folder = self.dirs.get("") or self.dirs.get("pids") or next(iter(self.dirs.values()), None)
        try:  # 0: a process of another PID namespace (never a pid to signal)
            return [pid for p in (folder / "cgroup.procs").read_text().split() if (pid := int(p)) > 0] if folder else []
        except OSError:
            return []

    def freeze(self, frozen: bool) -> None:
        """Stop (or resume) every process in the cgroup; waits a little for the kernel to finish freezing."""
        if frozen == self.frozen:
            return
        if "" in self.dirs and (self.dirs[""] / "cgroup.freeze").exists():
            control, value, done = self.dirs[""] / "cgroup.freeze", "1" if frozen else "0", lambda f: f"frozen {int(frozen)}" in (f.parent / "cgroup.events").read_text()
        elif "freezer" in self.dirs:
            control, value, done = self.dirs["freezer"] / "freezer.state", "FROZEN" if frozen else "THAWED", lambda f: f.read_text().strip() == value
        else:
            return
        try:
            control.write_text(value)
            self.frozen = frozen
            deadline = time.monotonic() + FREEZE_WAIT_S
            while frozen and not done(control) and time.monotonic() < deadline:
                time.sleep(0.002)
        except OSError as e:
            log.warning("could not %s cgroup %s: %s", "freeze" if frozen else "thaw", self.name, e)

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup (a frozen v1 cgroup is thawed first, or the kill waits)."""
        kill = self.dirs.get("", Path("/nonexistent")) / "cgroup.kill"
        if kill.exists():
            kill.write_text("1")
            return
        self.freeze(False)
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                _kill(pid)
            time.sleep(0.01)

    def remove(self) -> None:
        for folder in self.dirs.values():
            for _ in range(100):  # a cgroup can be removed once the kernel has reaped its last process
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
            else:
                log.warning("could not remove cgroup %s", folder)
        self.dirs = {}


_reaped: list[bool] = []
_reap_lock = threading.Lock()


def reap_stale_sandboxes(force: bool = False) -> int:
    """Kill and remove the sandboxes whose maker died without closing them (e.g. a server killed with SIGKILL).

    Their cgroups, next to this process's, are named after the maker's PID namespace, pid and start
    time; a maker of this PID namespace that is gone (or whose pid now belongs to another process)
    leaves them stale. Killing their processes
    kills each holder, and with it the sandbox's namespaces and mounts. Runs once per process unless
    ``force``; returns how many sandboxes it removed."""
    with _reap_lock:
        if _reaped and not force:
            return 0
        _reaped.append(True)
        try:
            parents = _cgroup_parents()
        except OSError:
            return 0
        stale: dict[str, _Cgroup] = {}
        for hierarchy, parent in parents.items():
            try:
                children = list(parent.iterdir())
            except OSError:
                continue
            for child in children:
                match = _STALE_NAME.match(child.name)
                if match is None or not child.is_dir():
                    continue
                namespace, pid, started = int(match.group(1)), int(match.group(2)), int(match.group(3))
                if namespace != _pid_namespace() or pid == os.getpid() or _process_start(pid) == started:
                    continue  # its maker still runs (or is one this process cannot see: not its to judge)
                stale.setdefault(child.name, {})[hierarchy] = child
        for name, dirs in stale.items():
            group = _Cgroup.existing(name, dirs)
            group.kill_all()
            group.remove()
        sandboxes = len({name.removesuffix("-eval") for name in stale})
        if sandboxes:
            log.warning("removed %d sandbox(es) left behind by a process that died without closing them", sandboxes)
        return sandboxes


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def _cgroup_name() -> str:
    return f"{CGROUP_PREFIX}{_pid_namespace()}-{os.getpid()}-{_process_start(os.getpid()) or 0}-{uuid.uuid4().hex[:12]}"


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
