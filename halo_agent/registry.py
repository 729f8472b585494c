"""The REAL task registry: list it, snapshot it with a train/eval split, and run from a snapshot.

agisdk keeps its tasks as JSON files per task version (``webclones/v1``,
``webclones/v2``, each with ``tasks/*.json`` and, for v2, ``eval_scripts/*.py``)
and finds them through ``task_config.VERSION_DIRS``. An SDK update can change a
goal, an eval or a script, so HALO snapshots the registry — every task's JSON and
every eval script it uses — into one file::

    halo-agent tasks --env real --task-version v2 --snapshot real-v2.json

and ``--task-registry real-v2.json`` makes rollouts and evals run exactly those
tasks: ``use_snapshot`` writes the snapshot's files into a cache folder and points
``VERSION_DIRS[version]`` there, so agisdk's own ``TaskConfig`` and evaluator
read them (the task ids stay ``v2.gomail-1``). The snapshot also fixes the
train/eval split, so no one reports a score on tasks a model trained on.

Local clones (``halo_agent.sites``) register their tasks the way agisdk registers
its own: ``register_local_tasks`` adds the ``halo-local`` version directory.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Collection, Iterable

from halo_agent.envs.base import TaskSpec, UnknownTaskError
from halo_agent.sites import LOCAL_TASK_VERSION, SITES_DIR

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = "halo-real-task-registry"
SNAPSHOT_FORMAT_VERSION = 1
DEFAULT_TASK_VERSION = "v2"
DEFAULT_EVAL_FRACTION = 0.2
# Changing how tasks are split changes which scores are comparable: bump with any change.
SPLIT_METHOD = "per-site-sha256-v1"


class RegistryError(ValueError):
    """A task registry or snapshot that cannot be used; the message says what to do."""


def _task_config_module():
    from halo_agent.browser import ensure_environment

    ensure_environment()  # agisdk imports tiktoken, which must not download
    from agisdk.REAL.browsergym.webclones import task_config

    return task_config


def _refresh_index(task_config, version: str) -> list[str]:
    """Re-read one version's task names into agisdk's indexes (after VERSION_DIRS changed)."""
    names = sorted(p[:-5] for p in os.listdir(os.path.join(task_config.VERSION_DIRS[version], "tasks")) if p.endswith(".json"))
    task_config.TASKS_BY_VERSION[version] = names
    for key in [k for k, (v, _) in task_config.TASK_INDEX.items() if v == version]:
        del task_config.TASK_INDEX[key]
    task_config.TASK_INDEX.update({f"{version}.{n}": (version, n) for n in names})
    task_config.TASKS[:] = sorted(task_config.TASK_INDEX)
    return names


def _register_gym_ids(version: str, names: Iterable[str]) -> None:
    from agisdk.REAL.browsergym.core.registration import register_task
    from agisdk.REAL.browsergym.webclones.base import AbstractWebCloneTask

    for name in names:
        register_task(f"{version}.{name}", AbstractWebCloneTask, task_kwargs={"task_name": name, "task_version": version})


def register_task_version(version: str, directory: str | os.PathLike[str]) -> list[str]:
    """Add (or repoint) a task version folder in agisdk's registry; returns its task names.

    ``directory`` holds ``tasks/*.json`` and optionally ``eval_scripts/*.py``, like
    agisdk's own ``webclones/v2``.
    """
    task_config = _task_config_module()
    directory = os.path.abspath(directory)
    if not os.path.isdir(os.path.join(directory, "tasks")):
        raise RegistryError(f"{directory} has no tasks/ folder: a task version folder holds tasks/*.json")
    task_config.VERSION_DIRS[version] = directory
    names = _refresh_index(task_config, version)
    _register_gym_ids(version, names)
    return names


def register_local_tasks() -> list[str]:
    """Register the tasks of HALO's local clones (task version ``halo-local``). Idempotent."""
    return register_task_version(LOCAL_TASK_VERSION, SITES_DIR)


def task_versions() -> list[str]:
    return sorted(_task_config_module().VERSION_DIRS)


def _task_spec(task_config, version: str, name: str) -> tuple[TaskSpec, dict[str, Any]]:
    config = task_config.TaskConfig(name, version)
    raw = dict(config.config_json)
    website = raw.get("website") or {}
    evals = [e.to_json() for e in config.get_evals()]
    spec = TaskSpec(
        task_id=config.canonical_id,
        env="real",
        site=str(website.get("id") or name.rsplit("-", 1)[0]),
        task_version=version,
        goal=config.get_goal(),
        extra={
            "url": config.get_start_url(),
            "difficulty": raw.get("difficulty"),
            "challenge_type": raw.get("challengeType"),
            "points": raw.get("points"),
            "possible": raw.get("possible", True),
            "evals": evals,
        },
    )
    return spec, raw


def _task_config_for(task_version: str):
    """agisdk's task_config module, with ``task_version`` known to it (HALO's local tasks registered on demand)."""
    task_config = _task_config_module()
    if task_version == LOCAL_TASK_VERSION:
        register_local_tasks()
    if task_version not in task_config.VERSION_DIRS:
        raise RegistryError(
            f"unknown REAL task version {task_version!r}: choose one of {', '.join(sorted(task_config.VERSION_DIRS))}"
        )
    return task_config


def list_real_tasks(task_version: str = DEFAULT_TASK_VERSION, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> list[TaskSpec]:
    """Every task of one version of the live registry, with the default train/eval split."""
    task_config = _task_config_for(task_version)
    specs = [_task_spec(task_config, task_version, n)[0] for n in task_config.TASKS_BY_VERSION[task_version]]
    return assign_split(specs, eval_fraction)


def assign_split(tasks: list[TaskSpec], eval_fraction: float = DEFAULT_EVAL_FRACTION, salt: str = "") -> list[TaskSpec]:
    """A deterministic train/eval split, stratified by site.

    Within each site, tasks are ordered by sha256(salt, task id) and the first
    ``round(eval_fraction * n)`` go to eval (at least one where a site has two or
    more tasks), so every site is represented on both sides.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise RegistryError(f"eval fraction {eval_fraction} must be in [0, 1)")
    by_site: dict[str, list[TaskSpec]] = {}
    for t in tasks:
        by_site.setdefault(t.site, []).append(t)
    eval_ids: set[str] = set()
    for site_tasks in by_site.values():
        ranked = sorted(site_tasks, key=lambda t: hashlib.sha256(f"{salt}\x1f{t.task_id}".encode()).hexdigest())
        n_eval = int(math.floor(eval_fraction * len(ranked) + 0.5))
        if eval_fraction > 0 and len(ranked) >= 2:
            n_eval = min(max(n_eval, 1), len(ranked) - 1)
        eval_ids.update(t.task_id for t in ranked[:n_eval])
    return [dataclasses.replace(t, split="eval" if t.task_id in eval_ids else "train") for t in tasks]


# ----------------------------------------------------------------------------- snapshots


def build_snapshot(
    task_version: str = DEFAULT_TASK_VERSION,
    eval_fraction: float = DEFAULT_EVAL_FRACTION,
    salt: str = "",
    task_ids: Collection[str] | None = None,
) -> dict[str, Any]:
    """The registry of one task version (or of ``task_ids`` in it) as a JSON-able snapshot, task JSONs and eval scripts included."""
    task_config = _task_config_for(task_version)
    specs, configs = [], {}
    for name in task_config.TASKS_BY_VERSION[task_version]:
        spec, raw = _task_spec(task_config, task_version, name)
        specs.append(spec)
        configs[spec.task_id] = raw
    # The split is assigned over the whole version, so a snapshot of some tasks splits them as the full one does.
    specs = assign_split(specs, eval_fraction, salt)
    if task_ids is not None:
        wanted = set(task_ids)
        specs = [spec for spec in specs if spec.task_id in wanted]
    scripts_dir = Path(task_config.VERSION_DIRS[task_version]) / "eval_scripts"
    scripts: dict[str, str] = {}
    for spec in specs:
        for ev in spec.extra["evals"]:
            script = ev.get("script")
            if script and script not in scripts:
                path = scripts_dir / script
                if not path.is_file():
                    raise RegistryError(f"task {spec.task_id} names eval script {script} but {path} does not exist")
                scripts[script] = path.read_text(encoding="utf-8")
    return {
        "format": SNAPSHOT_FORMAT,
        "format_version": SNAPSHOT_FORMAT_VERSION,
        "env": "real",
        "task_version": task_version,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "agisdk_version": _agisdk_version(),
        "split": {"method": SPLIT_METHOD, "eval_fraction": eval_fraction, "salt": salt},
        "n_tasks": len(specs),
        "tasks": [{**spec.to_dict(), "config": configs[spec.task_id]} for spec in specs],
        "eval_scripts": scripts,
    }


def write_snapshot(
    path: str | os.PathLike[str],
    task_version: str = DEFAULT_TASK_VERSION,
    eval_fraction: float = DEFAULT_EVAL_FRACTION,
    salt: str = "",
    task_ids: Collection[str] | None = None,
) -> dict[str, Any]:
    """Write the registry snapshot of ``task_version`` (or of ``task_ids`` in it) to ``path`` (JSON); returns it."""
    snapshot = build_snapshot(task_version, eval_fraction, salt, task_ids)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(snapshot, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    log.info("wrote %d %s tasks to %s", snapshot["n_tasks"], task_version, path)
    return snapshot


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a snapshot written by ``write_snapshot``."""
    try:
        snapshot = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RegistryError(f"task registry {path} does not exist: write one with `halo-agent tasks --env real --snapshot FILE`") from None
    except json.JSONDecodeError as e:
        raise RegistryError(f"task registry {path} is not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(snapshot, dict) or snapshot.get("format") != SNAPSHOT_FORMAT:
        raise RegistryError(f"{path} is not a HALO REAL task registry snapshot")
    if snapshot.get("format_version") != SNAPSHOT_FORMAT_VERSION:
        raise RegistryError(
            f"{path} has snapshot format {snapshot.get('format_version')}, this HALO reads {SNAPSHOT_FORMAT_VERSION}: write it again"
        )
    return snapshot


def snapshot_tasks(snapshot: dict[str, Any]) -> list[TaskSpec]:
    return [TaskSpec.from_dict(t) for t in snapshot["tasks"]]


def snapshot_digest(snapshot: dict[str, Any]) -> str:
    """Content hash of what a snapshot makes run (tasks and scripts, not its creation time)."""
    content = {k: snapshot[k] for k in ("task_version", "split", "tasks", "eval_scripts")}
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def _cache_root() -> Path:
    base = os.environ.get("HALO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "halo"
    )
    return Path(base) / "real-registry"


def use_snapshot(snapshot_or_path: dict[str, Any] | str | os.PathLike[str]) -> list[TaskSpec]:
    """Make this process run the snapshot's tasks: its JSONs and eval scripts replace the live version's.

    Returns the snapshot's tasks. Call it in every worker process (``RealEnv`` does,
    given ``task_registry``).
    """
    snapshot = snapshot_or_path if isinstance(snapshot_or_path, dict) else load_snapshot(snapshot_or_path)
    version = snapshot["task_version"]
    folder = _cache_root() / snapshot_digest(snapshot) / version
    if not (folder / "COMPLETE").exists():
        (folder / "tasks").mkdir(parents=True, exist_ok=True)
        (folder / "eval_scripts").mkdir(parents=True, exist_ok=True)
        for task in snapshot["tasks"]:
            name = task["task_id"].split(".", 1)[1]
            _write_atomic(folder / "tasks" / f"{name}.json", json.dumps(task["config"], indent=2, ensure_ascii=False))
        for script, source in snapshot.get("eval_scripts", {}).items():
            if os.path.basename(script) != script:
                raise RegistryError(f"snapshot names an eval script with a path ({script!r}); refusing to write it")
            _write_atomic(folder / "eval_scripts" / script, source)
        (folder / "COMPLETE").touch()
    register_task_version(version, folder)
    return snapshot_tasks(snapshot)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def resolve_tasks(task_ids: Iterable[str], tasks: list[TaskSpec]) -> list[TaskSpec]:
    """Pick tasks by id (``v2.gomail-1``, or ``gomail-1`` when unambiguous)."""
    by_id = {t.task_id: t for t in tasks}
    by_name: dict[str, list[TaskSpec]] = {}
    for t in tasks:
        by_name.setdefault(t.task_id.split(".", 1)[-1], []).append(t)
    out = []
    for task_id in task_ids:
        if task_id in by_id:
            out.append(by_id[task_id])
        elif len(by_name.get(task_id, [])) == 1:
            out.append(by_name[task_id][0])
        else:
            raise UnknownTaskError(f"unknown REAL task {task_id!r}: list them with `halo-agent tasks --env real`")
    return out


def _agisdk_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("agisdk")
    except Exception:  # the distribution metadata may be missing in odd installs
        return None
