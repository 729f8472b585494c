"""An experiment root's records: its registrations and its stages, each with the code it ran at.

``ROOT/experiment.json`` holds the registrations: each one the protocol file's sha256 and path, the code commit
(``git rev-parse HEAD`` of HALO's checkout; HALO's version where it is not a checkout) and the package versions,
when it was made. The latest registration is the one in force:

- a stage runs only at the registered commit with the registered protocol file; at another commit it is refused
  until ``halo-train experiment register`` is run again, which appends a registration at the new commit (stages
  already done keep theirs: the report lists every commit the results span);
- the protocol file itself cannot change once a stage has run: a change after the first result is a new protocol
  (a new name or version), never a re-registration.

``ROOT/stages.jsonl`` holds one line per stage start and end: its name, kind, run id, the evaluated policy (for an
evaluation) and the code identity it ran at. An evaluation of test seeds is recorded when it starts; a second one of
the same cell is refused, whatever the lake holds (a cell interrupted part-way is resumed with the same policy, not
evaluated again).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import functools
import hashlib
import json
import os
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

PACKAGES = ("halo", "torch", "transformers", "peft", "trl", "accelerate", "duckdb", "deltalake", "playwright", "miniwob")
CODE_DIR = Path(__file__).resolve().parents[2]  # HALO's checkout (or site-packages, where it is installed)


class ExperimentError(RuntimeError):
    """A stage the records forbid (unregistered, another commit, a test split again); the message says what to do."""


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(code_dir: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(code_dir), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def code_identity(code_dir: Path | None = None) -> dict[str, Any]:
    """The commit HALO's code is at (None outside a git checkout), whether tracked files differ from it, and the
    package versions."""
    code_dir = Path(code_dir or os.environ.get("HALO_EXPERIMENT_CODE_DIR") or CODE_DIR)
    commit = _git(code_dir, "rev-parse", "HEAD")
    dirty = None if commit is None else bool(_git(code_dir, "status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit, "dirty": dirty, "packages": package_versions()}


OPENMP_SETTINGS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def machine() -> dict[str, Any]:
    """What a stage's seconds depend on besides the code: the cores, the load when it starts, and the OpenMP settings
    its processes inherit (None where unset; HALO's commands set a short spin unless one is set)."""
    return {"cores": os.cpu_count(), "load_average": round(os.getloadavg()[0], 2),
            "openmp": {k: os.environ.get(k) for k in OPENMP_SETTINGS}}


def code_key(identity: dict[str, Any]) -> str:
    """What must match between a registration and a stage: the commit, or HALO's version outside a checkout."""
    return identity["commit"] or f"halo {identity['packages'].get('halo')}"


def file_commit(path: Path) -> str | None:
    """The last commit that touched a file, where it is committed unchanged (None: not in git, or edited since)."""
    path = path.resolve()
    if _git(path.parent, "status", "--porcelain", "--", path.name):
        return None
    return _git(path.parent, "log", "-1", "--format=%H", "--", path.name) or None


class Records:
    """The registration and stage records of one experiment root."""

    def __init__(self, root: str | Path, code_dir: Path | None = None):
        self.root = Path(root)
        self.code_dir = code_dir
        self.registration_file = self.root / "experiment.json"
        self.stages_file = self.root / "stages.jsonl"

    # ------------------------------------------------------------------ registration
    def registrations(self) -> list[dict[str, Any]]:
        if not self.registration_file.exists():
            return []
        return list(json.loads(self.registration_file.read_text()).get("registrations", []))

    def current(self) -> dict[str, Any] | None:
        regs = self.registrations()
        return regs[-1] if regs else None

    def register(self, protocol) -> dict[str, Any]:
        """Register ``protocol`` at the code's current commit (again: at a new commit, the same file)."""
        current = self.current()
        if current and current["protocol_sha256"] != protocol.sha256 and self.stages():
            raise ExperimentError(
                f"{protocol.path} changed since it was registered ({current['protocol_sha256'][:12]} -> "
                f"{protocol.sha256[:12]}) and {len(self.stages())} stage records exist under {self.root}: a change "
                "after the first result is a new protocol (a new name or version, its own root)")
        if current and current["name"] != protocol.name:
            raise ExperimentError(f"{self.root} holds experiment {current['name']!r}, not {protocol.name!r}: use another --root")
        identity = code_identity(self.code_dir)
        reg = {"name": protocol.name, "version": protocol.version, "protocol": str(protocol.path.resolve()),
               "protocol_sha256": protocol.sha256, "protocol_commit": file_commit(protocol.path), **identity,
               "registered_at": now()}
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.registration_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"registrations": [*self.registrations(), reg]}, indent=1) + "\n")
        tmp.replace(self.registration_file)
        return reg

    def check(self, protocol) -> dict[str, Any]:
        """The code identity a stage may run at now; ExperimentError where the registration does not allow it."""
        current = self.current()
        if current is None:
            raise ExperimentError(f"{protocol.name} is not registered under {self.root}: run "
                                  f"`halo-train experiment register {protocol.path} --root {self.root}` first")
        if current["protocol_sha256"] != protocol.sha256:
            raise ExperimentError(f"{protocol.path} is not the file registered under {self.root} (sha256 "
                                  f"{protocol.sha256[:12]}, registered {current['protocol_sha256'][:12]})")
        identity = code_identity(self.code_dir)
        if code_key(identity) != code_key(current):
            raise ExperimentError(
                f"the code is at {code_key(identity)[:12]}, the experiment is registered at {code_key(current)[:12]}: "
                f"a stage at another commit runs only once the protocol is registered again there "
                f"(`halo-train experiment register {protocol.path} --root {self.root}`)")
        return identity

    # ------------------------------------------------------------------ stages
    def stages(self) -> list[dict[str, Any]]:
        if not self.stages_file.exists():
            return []
        return [json.loads(line) for line in self.stages_file.read_text().splitlines() if line.strip()]

    def append(self, record: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.stages_file, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def test_started(self, run_id: str) -> dict[str, Any] | None:
        """The record of a test cell's evaluation start, if it ever started."""
        return next((s for s in self.stages() if s.get("event") == "start" and s.get("run_id") == run_id
                     and s.get("test")), None)

    def check_test_once(self, run_id: str, policy: str, episodes_in_lake: int) -> None:
        """Refuse a test cell's second evaluation: another policy than the one that started it, or a start again
        once its episodes are gone from the lake."""
        started = self.test_started(run_id)
        if started is None:
            return
        if started.get("policy") != policy:
            raise ExperimentError(f"{run_id}: its test seeds were evaluated with {started.get('policy')} at "
                                  f"{started['at']}; evaluating them again with {policy} is refused")
        if episodes_in_lake == 0:
            raise ExperimentError(f"{run_id}: its test seeds were evaluated at {started['at']} (commit "
                                  f"{(started.get('commit') or '?')[:12]}) and their episodes are not in the lake: "
                                  "a second evaluation is refused")


LOCK = "run.lock"


def holder(root: str | Path) -> dict[str, Any] | None:
    """Who holds ``root`` now (``pid``, ``command``, ``since``), or None: the lock's first holder wrote them."""
    path = Path(root) / LOCK
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        try:
            return json.loads(path.read_text() or "{}")
        except ValueError:  # its holder is writing it
            return {}
    finally:
        os.close(fd)


@contextlib.contextmanager
def holding(root: str | Path, command: str) -> Iterator[None]:
    """Hold ``root`` for ``command`` (``run``, ``pack``): one of them at a time, so that two runners never start the
    same stage and a pack never copies a root being written. The lock is the kernel's (``flock``), so it ends with
    the process however it ends, kill -9 included; stages' child processes do not inherit it. ``root`` exists."""
    root = Path(root)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for _ in range(2):  # a `status` checking the lock holds it for a moment
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.2)
        else:
            other = holder(root) or {}
            raise ExperimentError(
                f"{root} is in use by `experiment {other.get('command', '?')}` (pid {other.get('pid', '?')}, since "
                f"{other.get('since', '?')}): stop it or let it finish first") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "command": command, "since": now()}).encode())
        yield
    finally:
        os.close(fd)


def policy_fingerprint(adapter: str | None, base_model: str) -> str:
    """What a cell evaluates: the base model's name and the adapter's weights, hashed."""
    if not adapter:
        return f"{Path(base_model).name}"
    weights = Path(adapter) / "adapter_model.safetensors"
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16] if weights.exists() else "missing"
    return f"{Path(base_model).name}+{Path(adapter).parent.name}/{Path(adapter).name}@{digest}"
