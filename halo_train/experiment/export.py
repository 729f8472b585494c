"""An experiment's results as data: RESULTS/NAME/ from its lake, adapters and records.

- ``episodes.parquet``: one row per evaluation episode — arm, training_seed, split (test_seeds | heldout_tasks |
  dev), task_id, task_seed, attempt, success, n_steps, shaped_return, first_action (the action of its first step,
  as the lake stores it) — plus env_steps (the environment steps the
  evaluated policy was trained with: the curve's x), version (an online arm's served version on the dev curve),
  run_id, sampling_seed (the rollout's --seed) and temperature (the evaluation's);
- ``timing.json``: seconds per evaluation step, per online iteration (rollout, update, reload, and what the update
  had to learn from) and per training job;
- ``evidence.json``: what the offline arms learnt from (each training seed's sample, successes per task; each bc/dpo
  job's rows, epochs and train_metrics at its start and end) and how new the evaluated states are (per split and
  task, zero_shot's first pages and steps that some training run also had);
- ``meta.json``: the protocol file and the commit that registered it, the registrations and the commit and package
  versions of every stage (from the root's records), the planned episodes of every cell (the report marks the
  results partial while any is short), when it was exported;
- ``adapters/ARM/``: the final LoRA adapter of each trained arm's first training seed, stored in float16.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from halo_data.novelty import seen_states

# episodes.parquet's columns and their Arrow types
EPISODE_COLUMNS = {"arm": "string", "training_seed": "int64", "split": "string", "task_id": "string", "task_seed": "int64",
                   "attempt": "int64", "success": "bool_", "n_steps": "int64", "shaped_return": "float64",
                   "first_action": "string", "env_steps": "int64", "version": "int64", "run_id": "string",
                   "sampling_seed": "int64", "temperature": "float64", "raw_reward": "float64"}
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def _eval_runs(runner) -> dict[str, dict[str, Any]]:
    """run id -> (arm, training_seed, split, version, temperature) of every evaluation run the protocol plans."""
    p = runner.p
    runs: dict[str, dict[str, Any]] = {}
    for arm in p.arms:
        for seed in p.arm_seeds(arm):
            for cell in p.eval_cells(arm, seed):
                runs[cell.run_id] = {"arm": arm, "training_seed": seed, "split": cell.split, "version": None,
                                     "temperature": p.interface["temperature"] if cell.temperature is None else cell.temperature}
    return runs


def _online_seeds(p) -> list[tuple[str, int]]:
    return [(arm, seed) for arm in p.online_arms() for seed in p.arm_seeds(arm)]


def _online_curve_runs(runner, seed: int, arm: str = "online_grpo") -> dict[str, dict[str, Any]]:
    online = runner.p.online_run(seed, arm)
    rows = runner.state.query("select distinct run_id from steps where starts_with(run_id, $p)", {"p": f"{online}-eval-v"},
                              views=False, tables=("steps",))
    out = {}
    for row in rows:
        m = re.fullmatch(re.escape(online) + r"-eval-v(\d+)-s\d+", row["run_id"])
        if m:
            out[row["run_id"]] = {"arm": arm, "training_seed": seed, "split": "dev", "version": int(m.group(1)),
                                  "temperature": runner.p.interface["temperature"]}
    return out


def _steps_of(runner, run_ids: list[str]) -> int:
    if not run_ids:
        return 0
    rows = runner.state.query("select coalesce(sum(n_steps), 0) n from episodes where list_contains($ids, run_id)", {"ids": run_ids})
    return int(rows[0]["n"]) if rows else 0


def training_env_steps(runner, arm: str, seed: int) -> dict[int | None, int]:
    """Environment steps behind each evaluated version of an arm (None: its final policy)."""
    p = runner.p
    if p.arms[arm]["kind"] != "trained":
        return {None: 0}
    if p.method(arm) == "expert_iteration":
        return {None: _steps_of(runner, runner.round_runs(arm, seed, p.rounds(arm) - 1))}
    if p.method(arm) != "online":
        return {None: _steps_of(runner, [p.sample_run(seed)])}
    its = runner.state.online_iterations(p.online_run(seed, arm))
    steps, out, total = [], {0: 0}, 0
    for it in its:
        total += _steps_of(runner, [it["rollout_run"]])
        steps.append(total)
        version = int(it["served_after"]["version"])
        out.setdefault(version, total)
    out[None] = total
    return out


def episode_rows(runner) -> list[dict[str, Any]]:
    runs = _eval_runs(runner)
    for arm, seed in _online_seeds(runner.p):
        runs.update(_online_curve_runs(runner, seed, arm))
    if not runs:
        return []
    episodes = runner.state.query(
        "select e.run_id, e.task_id, e.task_seed, e.attempt_idx, e.success, e.n_steps, e.shaped_return, e.raw_reward, "
        "f.action AS first_action from episodes e left join (select episode_id, action from steps "
        "where step_idx = 0 and list_contains($ids, run_id)) f using (episode_id) "
        "where list_contains($ids, e.run_id) order by e.run_id, e.task_id, e.task_seed, e.attempt_idx", {"ids": sorted(runs)})
    env_steps: dict[tuple[str, int], dict[int | None, int]] = {}
    rows = []
    for e in episodes:
        info = runs[e["run_id"]]
        key = (info["arm"], info["training_seed"])
        if key not in env_steps:
            env_steps[key] = training_env_steps(runner, *key)
        rows.append({
            "arm": info["arm"], "training_seed": info["training_seed"], "split": info["split"],
            "task_id": e["task_id"], "task_seed": int(e["task_seed"]), "attempt": int(e["attempt_idx"]),
            "success": bool(e["success"]), "n_steps": int(e["n_steps"]), "shaped_return": float(e["shaped_return"] or 0.0),
            "first_action": e["first_action"],
            "env_steps": env_steps[key].get(info["version"], env_steps[key].get(None)), "version": info["version"],
            "run_id": e["run_id"], "sampling_seed": runner.p.policy_seed(info["training_seed"]),
            "temperature": info["temperature"],
            "raw_reward": None if e["raw_reward"] is None else float(e["raw_reward"]),
        })
    return rows


ONLINE_SIGNALS = ("success_rate/train", "rewards/mean", "rewards/std", "frac_reward_zero_std", "trainable_groups", "loss",
                  "clip_ratio", "importance_ratio_mean", "kl", "success_rate/heldout",
                  # the persistent learner's: what each update read and trained, and how far it moved the policy
                  "rows_produced", "rows_trained", "optimizer_steps", "approx_kl", "entropy", "displacement_from_previous",
                  "displacement_from_base", "groups_success_spread", "groups_shaping_spread_only",
                  "anchor_groups_with_spread", "step_advantage_share")


def timing(runner) -> dict[str, Any]:
    """Seconds per policy step of every evaluation run, per online iteration split, and per training job."""
    evals = runner.state.query(
        "select run_id, count(*) AS steps, avg(latency_ms) / 1000 AS policy_seconds_per_step, "
        "epoch(max(ended_at) - min(started_at)) / count(*) AS wall_seconds_per_step "
        "from steps where starts_with(run_id, $p) group by run_id order by run_id", {"p": f"{runner.p.prefix}-"},
        views=False, tables=("steps",))
    online = {}
    wall = {e["run_id"]: e["wall_seconds_per_step"] * e["steps"] for e in evals if e["wall_seconds_per_step"] is not None}
    for arm, seed in _online_seeds(runner.p):
        its = runner.state.online_iterations(runner.p.online_run(seed, arm))
        online[f"{arm}-s{seed}"] = [{
            "iteration": it["iteration"],
            "iteration_seconds": it["metrics"].get("iteration_seconds"),
            "rollout_seconds": wall.get(it["rollout_run"]),
            "update_seconds": it["metrics"].get("update_seconds"),
            "reload_seconds": it["metrics"].get("reload_seconds"),
            "rollout_steps_per_second": it["metrics"].get("rollout_steps_per_second"),
            "update": it.get("update"),
            # What the update had to learn from, and what it did: the evidence where a curve does not rise.
            "signal": {k: it["metrics"][k] for k in ONLINE_SIGNALS if k in it["metrics"]},
        } for it in its]
    train = _train_jobs(runner, "run_id, job_type, output_dir, epoch(ended_at - started_at) AS job_seconds")
    return {"eval_runs": evals, "online_iterations": online, "train_jobs": train}


def _train_jobs(runner, columns: str) -> list[dict[str, Any]]:
    """The ``runs`` rows (``columns`` of them) of the training jobs that wrote under this experiment's adapters."""
    jobs = runner.state.query(f"select {columns} from runs where kind = 'train' and output_dir is not null "
                              "order by run_id", views=False, tables=("runs",))
    root = str((runner.root / "adapters").resolve())
    return [j for j in jobs if str(j["output_dir"] or "").startswith(root)]


# What an offline job's train_metrics say it did, by job type: the mean of the first and of the last logged steps.
OFFLINE_SIGNALS = {"bc": ("loss", "mean_token_accuracy", "entropy"),
                   "dpo": ("loss", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected")}
SIGNAL_WINDOW = 4  # logged steps averaged at each end (one step is one batch: a single one is noisy)


def evidence(runner) -> dict[str, Any]:
    """What the trained arms learnt from, how new the evaluated states are and what the observation named:
    ``samples``, ``offline_jobs``, ``state_novelty`` and ``observation_names`` (online_grpo's per-iteration signal
    is in timing.json, beside its seconds)."""
    jobs = _train_jobs(runner, "run_id, job_type, output_dir, source_view")
    return {**offline_training(runner, jobs), "state_novelty": state_novelty(runner), "budget": budget(runner),
            "observation_names": observation_names(runner)}


def observation_names(runner) -> dict[str, dict[str, dict[str, int]]]:
    """What the elements observation named, per split and task, over zero_shot's evaluation steps (the first page
    does not depend on the policy; later ones little): the elements offered, those without an accessible name, and
    the steps where no offered element had one (under ``halo-prompt-v2-elements`` a page of ``image ''`` lines,
    where only position tells the elements apart; later versions describe them). Empty for the axtree observation."""
    from halo_agent.actions import element_lines
    from halo_data import prompts

    if not str(runner.p.interface.get("observation", "")).startswith("elements"):
        return {}
    splits = {run: info["split"] for run, info in _eval_runs(runner).items()
              if info["arm"] == "zero_shot" and info["split"] != "dev"}
    rows = runner.state.query("select run_id, task_id, prompt from steps where list_contains($r, run_id) and prompt "
                              "is not null", {"r": sorted(splits)}) if splits else []
    out: dict[str, dict[str, dict[str, int]]] = {}
    for row in rows:
        user = [m for m in prompts.loads(row["prompt"]) if m.get("role") == "user"]
        text = prompts.text_only(user[-1:])[0]["content"] if user else ""
        page = text.split("Page:\n", 1)[-1].split("\nGoal:", 1)[0]
        elements = element_lines(page)
        cell = out.setdefault(splits[row["run_id"]], {}).setdefault(
            row["task_id"], {"steps": 0, "elements": 0, "unnamed": 0, "steps_with_no_name": 0})
        unnamed = sum(1 for e in elements if not e.name)
        cell["steps"] += 1
        cell["elements"] += len(elements)
        cell["unnamed"] += unnamed
        cell["steps_with_no_name"] += bool(elements) and unnamed == len(elements)
    return out


def arm_training_runs(runner, arm: str, seed: int) -> list[str]:
    """The runs whose episodes one trained arm's training seed took: its sample, its rounds or its online rollouts."""
    p = runner.p
    method = p.method(arm)
    if method == "expert_iteration":
        return runner.round_runs(arm, seed, p.rounds(arm) - 1)
    if method == "online":
        return [it["rollout_run"] for it in runner.state.online_iterations(p.online_run(seed, arm))]
    return [p.sample_run(seed)]


def training_runs(runner) -> list[str]:
    """Every run whose episodes some trained arm learnt from."""
    p = runner.p
    runs = [p.sample_run(seed) for seed in p.training_seeds]
    for arm in p.trained_arms():
        for seed in p.arm_seeds(arm):
            runs += [r for r in arm_training_runs(runner, arm, seed) if r not in runs]
    return runs


def budget(runner) -> dict[str, dict[str, dict[str, int]]]:
    """The environment budget each trained arm and training seed took, counted from the lake (episodes and steps of
    its training runs) beside the one the protocol plans."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for arm in runner.p.trained_arms():
        for seed in runner.p.arm_seeds(arm):
            runs = arm_training_runs(runner, arm, seed)
            rows = runner.state.query("select count(*) AS episodes, coalesce(sum(n_steps), 0) AS steps from episodes "
                                      "where list_contains($r, run_id)", {"r": runs}) if runs else []
            row = rows[0] if rows else {"episodes": 0, "steps": 0}
            out.setdefault(arm, {})[f"s{seed}"] = {"planned_episodes": runner.p.arm_episodes(arm),
                                                   "episodes": int(row["episodes"]), "steps": int(row["steps"])}
    return out


def state_novelty(runner) -> dict[str, dict[str, dict[str, int]]]:
    """How new the evaluated states are, per split and task (``halo_data.novelty.seen_states`` over zero_shot's
    evaluations against every training run): the first page does not depend on the policy, so zero_shot's stand for
    every arm's. Where the observation renders a task's pages alike for every seed, its test seeds are training states
    again."""
    splits = {run: info["split"] for run, info in _eval_runs(runner).items()
              if info["arm"] == "zero_shot" and info["split"] != "dev"}
    if not splits:
        return {}
    lake = runner.state.open()
    seen = seen_states(lake, training_runs(runner), sorted(splits)) if lake is not None else {}
    out: dict[str, dict[str, dict[str, int]]] = {}
    for run_id, tasks in seen.items():
        out.setdefault(splits[run_id], {}).update(tasks)
    return out


def offline_training(runner, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The evidence behind the offline arms: each training seed's sample (episodes and successes per task: all that
    bc_filtered and dpo learn from), and each bc/dpo job's data (the rows or pairs it read, the epochs over them) and
    train_metrics."""
    p = runner.p
    samples = {}
    for seed in p.training_seeds:
        rows = runner.state.query("select task_id, count(*) AS episodes, sum(success::int) AS successes from episodes "
                                  "where run_id = $r group by task_id order by task_id", {"r": p.sample_run(seed)})
        if rows:
            samples[f"s{seed}"] = {r["task_id"]: {"episodes": int(r["episodes"]), "successes": int(r["successes"])}
                                   for r in rows}
    offline = []
    folders = [str(j["output_dir"]) for j in jobs]
    for job in jobs:
        if job["job_type"] not in OFFLINE_SIGNALS:
            continue
        folder = Path(str(job["output_dir"]))  # ARM-sSEED, or ARM-sSEED/round-R for a round of expert iteration
        round_ = int(folder.name.removeprefix("round-")) if re.fullmatch(r"round-\d+", folder.name) else None
        arm, _, seed = (folder.parent.name if round_ is not None else folder.name).rpartition("-s")
        # What the job read, as it recorded it when it saved: the view's rows then. (Counting the view now would
        # not do: dpo_pairs pairs steps of one prompt across the whole lake, so a later run on the same task seeds
        # takes over some of a sample's pairs.)
        stats_file = Path(str(job["output_dir"])) / "final" / "training_stats.json"
        stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
        metrics = runner.state.query(
            "select metric, step, value from train_metrics where run_id = $r and list_contains($m, metric) "
            "order by metric, step", {"r": job["run_id"], "m": list(OFFLINE_SIGNALS[job["job_type"]])},
            views=False, tables=("train_metrics",))
        by_metric: dict[str, list[float]] = {}
        for m in metrics:
            by_metric.setdefault(m["metric"], []).append(float(m["value"]))
        if not by_metric and folders.count(str(job["output_dir"])) > 1:
            continue  # stopped before its first step: the job that went on in its folder logged every step
        offline.append({
            "arm": arm, "training_seed": int(seed) if seed.isdigit() else seed, "round": round_, "job_type": job["job_type"],
            "source": job["source_view"], "rows": stats.get("rows"), "epochs": stats.get("epoch"),
            "logged_steps": max((len(v) for v in by_metric.values()), default=0), "window": SIGNAL_WINDOW,
            "first": {k: sum(v[:SIGNAL_WINDOW]) / len(v[:SIGNAL_WINDOW]) for k, v in by_metric.items()},
            "last": {k: sum(v[-SIGNAL_WINDOW:]) / len(v[-SIGNAL_WINDOW:]) for k, v in by_metric.items()},
        })
    return {"samples": samples, "offline_jobs": offline}


def _git_commit_of(path: Path) -> str | None:
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%H", "--", str(path)], capture_output=True, text=True,
                             cwd=path.parent, check=True)
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    return out.stdout.strip() or None


def half_bytes(src: Path) -> bytes:
    """A safetensors file's bytes with its floating tensors in float16 (half the size; LoRA deltas lose nothing
    that matters)."""
    from safetensors.torch import load_file, save

    return save({k: v.half().contiguous() if v.is_floating_point() else v for k, v in load_file(str(src)).items()})


def half_weights(src: Path, dst: Path) -> None:
    """``src`` in float16 (``half_bytes``) at ``dst``, written only where ``dst`` differs."""
    data = half_bytes(src)
    if not dst.exists() or dst.read_bytes() != data:
        dst.write_bytes(data)


def copy_adapter(src: Path, dst: Path) -> None:
    """The adapter's config and weights, the weights in float16."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "adapter_config.json", dst / "adapter_config.json")
    half_weights(src / "adapter_model.safetensors", dst / "adapter_model.safetensors")


def export(runner, results: Path) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from halo_train.experiment.state import BASE_MODEL

    results.mkdir(parents=True, exist_ok=True)
    rows = episode_rows(runner)
    table = pa.Table.from_pylist(rows, schema=pa.schema([(name, getattr(pa, kind)()) for name, kind in EPISODE_COLUMNS.items()]))
    pq.write_table(table, results / "episodes.parquet")
    (results / "timing.json").write_text(json.dumps(timing(runner), indent=1, default=str) + "\n")
    (results / "evidence.json").write_text(json.dumps(evidence(runner), indent=1, default=str) + "\n")
    p = runner.p
    planned = {c.run_id: {"arm": c.arm, "training_seed": c.training_seed, "split": c.split, "episodes": c.episodes}
               for arm in p.arms for seed in p.arm_seeds(arm) for c in p.eval_cells(arm, seed)}
    root = Path(__file__).resolve().parents[2]
    stages = [s for s in runner.records.stages() if s.get("event") == "start"]
    meta = {"protocol": str(p.path.resolve().relative_to(root)) if p.path.resolve().is_relative_to(root) else p.path.name,
            "registered_at_commit": _git_commit_of(p.path), "name": p.name, "version": p.version,
            "registrations": runner.records.registrations(),
            "stage_commits": sorted({s.get("commit") or "?" for s in stages}),
            "stages": [{k: s.get(k) for k in ("stage", "kind", "arm", "seed", "split", "run_id", "policy", "commit", "dirty",
                                              "packages", "machine", "at")} for s in stages],
            "arms": list(p.arms), "training_seeds": list(p.training_seeds), "planned": planned,
            "exported_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    (results / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    copied = []
    for arm in p.arms:
        if p.arms[arm]["kind"] == "trained":
            final = runner.final_adapter(arm, p.training_seeds[0])
            if final and final != BASE_MODEL:
                copy_adapter(Path(final), results / "adapters" / arm)
                copied.append(arm)
    return f"{len(rows)} evaluation episodes -> {results / 'episodes.parquet'}; adapters: {', '.join(copied) or 'none yet'}"
