"""Task screening before registration, on dev seeds only: is a candidate task a test of anything?

Per candidate task (the protocol's ``screening.candidates``):

- ``first_pages``: how many different first pages its dev seeds show under the experiment's observation (the
  prompt a policy sees at step 0, hashed as the lake hashes it; an environment reset each, no policy), and how
  many of the training sample's first pages (the task seeds training seed 0 samples from) are among them. A test
  seed is a dev seed of another range: a task whose dev pages repeat training pages will have test pages that do;
- ``random`` / ``heuristic`` / ``zero_shot``: success of the protocol's random and heuristic arms and of the base
  model on the same dev seeds (``halo-agent rollout`` into the screening lake, one run per arm and task);
- ``verdict``: the protocol's rules (``screening.rules``) applied to these figures.

Results go to one JSON file (``screening.json``), with the commit and package versions they were measured at.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterable

from halo_train.experiment.protocol import Protocol, ProtocolError
from halo_train.experiment.record import code_identity

log = logging.getLogger(__name__)

SCREEN_ARMS = ("random", "heuristic", "zero_shot")
DEFAULT_RULES = {"min_distinct_first_pages": 0.9, "max_pages_in_training": 0.1, "zero_shot_min": 0.05, "zero_shot_max": 0.6,
                 "random_max": 0.5}


def screening_rules(p: Protocol) -> dict[str, float]:
    """The protocol's screening rules (``screening.rules``) over HALO's defaults."""
    return {**DEFAULT_RULES, **((p.raw.get("screening") or {}).get("rules") or {})}


def screening_spec(p: Protocol) -> dict[str, Any]:
    spec = dict(p.raw.get("screening") or {})
    if not spec.get("candidates"):
        raise ProtocolError(f"{p.path}: screening.candidates names no tasks to screen")
    spec.setdefault("dev_first", int(p.splits["dev"]["first"]))
    spec.setdefault("dev_seeds", 16)
    spec.setdefault("train_pages", "all")
    spec["rules"] = screening_rules(p)
    return spec


def candidates(p: Protocol) -> list[str]:
    """The candidate tasks, train and held-out candidates alike (``screening.candidates`` is a list or a mapping of
    lists)."""
    c = screening_spec(p)["candidates"]
    names = [t for group in c.values() for t in group] if isinstance(c, dict) else list(c)
    return list(dict.fromkeys(p.tasks(tuple(names))))


def first_page_hashes(p: Protocol, task: str, seeds: Iterable[int]) -> dict[int, dict[str, Any]]:
    """task seed -> the step-0 prompt's hash (as ``steps.prompt_hash``) and the number of offered actions, from an
    environment reset of each seed under the protocol's observation."""
    from halo_agent.actions import page_actions
    from halo_agent.envs import environment_class
    from halo_agent.rollout.episode import build_observation
    from halo_data import ids, prompts

    cls = environment_class(p.interface["env"])
    env = cls(screenshots=False)
    spec = cls.task_spec(task)
    out = {}
    try:
        for seed in seeds:
            try:
                page = env.reset(spec, seed)
            except Exception as e:  # a page that does not load is a finding, not a crash of the screen
                out[seed] = {"hash": None, "actions": 0, "error": str(e).splitlines()[0]}
                continue
            obs = build_observation(page, task, [], 0, False, None, observation_format=p.interface["observation"])
            actions = page_actions(page.elements)
            out[seed] = {"hash": ids.sha256_hex(prompts.dumps(obs.messages)),
                         "actions": 0 if actions == ["noop()"] else len(actions)}
    finally:
        env.close()
    return out


def train_pages_seeds(p: Protocol) -> list[int]:
    """The train task seeds whose first pages the screen compares dev pages with. ``screening.train_pages: all`` (the
    default): every train seed the plan will use, each training seed's ``train_seeds_used`` of them. A task whose
    first pages come from a small set looks new against a few seeds and is not against the whole plan's: 16 dev
    seeds against 16 train seeds found 1 repeat where the plan's seeds repeated half the test pages. A number N:
    the first N train seeds of the first training seed."""
    spec = screening_spec(p)
    if spec["train_pages"] == "all":
        return [seed for t in p.training_seeds
                for seed in range(p.train_seed_start(t), p.train_seed_start(t) + p.train_seeds_used)]
    start = p.train_seed_start(p.training_seeds[0])
    return list(range(start, start + int(spec["train_pages"])))


def screen_first_pages(p: Protocol, tasks: list[str], echo: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    spec = screening_spec(p)
    dev = range(int(spec["dev_first"]), int(spec["dev_first"]) + int(spec["dev_seeds"]))
    train = train_pages_seeds(p)
    out = {}
    for task in tasks:
        pages = first_page_hashes(p, task, dev)
        trained = {v["hash"] for v in first_page_hashes(p, task, train).values() if v["hash"]}
        hashes = [v["hash"] for v in pages.values() if v["hash"]]
        out[task] = {"dev_seeds": len(dev), "loaded": len(hashes), "distinct_first_pages": len(set(hashes)),
                     "share_distinct": len(set(hashes)) / len(dev), "train_seeds_checked": len(train),
                     "dev_pages_in_training_sample": sum(h in trained for h in hashes),
                     "min_actions": min((v["actions"] for v in pages.values()), default=0),
                     "errors": sorted({v["error"] for v in pages.values() if v.get("error")})}
        echo(f"{task}: {len(set(hashes))}/{len(dev)} different first pages, "
             f"{out[task]['dev_pages_in_training_sample']} seen in training seeds, fewest actions {out[task]['min_actions']}")
    return out


def verdict(row: dict[str, Any], rules: dict[str, float]) -> list[str]:
    """The rules a task breaks (empty: it passes every rule on figures measured for it; one not measured is named)."""
    broken = []
    pages = row.get("first_pages") or {}
    if pages and pages["share_distinct"] < rules["min_distinct_first_pages"]:
        broken.append(f"distinct first pages {pages['share_distinct']:.0%} < {rules['min_distinct_first_pages']:.0%}")
    seen = pages.get("dev_pages_in_training_sample", 0) / pages["dev_seeds"] if pages else 0
    if seen > rules["max_pages_in_training"]:
        broken.append(f"{seen:.0%} of dev first pages appear in the training sample > {rules['max_pages_in_training']:.0%}")
    if pages and not pages.get("min_actions"):
        broken.append("a page offers no action")
    missing = [what for what, key in (("first pages", "first_pages"), ("random", "random"), ("zero-shot", "zero_shot"))
               if not row.get(key)]
    if missing:
        broken.append(f"not measured: {', '.join(missing)}")
    z = (row.get("zero_shot") or {}).get("rate")
    if z is not None and not rules["zero_shot_min"] <= z <= rules["zero_shot_max"]:
        broken.append(f"zero-shot {z:.0%} outside [{rules['zero_shot_min']:.0%}, {rules['zero_shot_max']:.0%}]")
    r = (row.get("random") or {}).get("rate")
    if r is not None and r >= rules["random_max"]:
        broken.append(f"random {r:.0%} >= {rules['random_max']:.0%}")
    return broken


def arm_success(runner, run_id: str) -> dict[str, Any]:
    rows = runner.state.query("select count(*) AS n, coalesce(sum(success::int), 0) AS s, avg(n_steps) AS steps "
                              "from episodes where run_id = $r", {"r": run_id})
    n, s = (int(rows[0]["n"]), int(rows[0]["s"])) if rows else (0, 0)
    return {"episodes": n, "successes": s, "rate": s / n if n else None,
            "mean_steps": round(float(rows[0]["steps"]), 2) if n else None}


def screen_run(runner, task: str, arm: str) -> str:
    return f"{runner.p.prefix}-screen-{arm}-{task.split('.', 1)[-1]}"


def screen_arms(runner, tasks: list[str], arms: list[str], seeds: int | None = None) -> dict[str, dict[str, Any]]:
    """Each arm's rollouts on the dev seeds of each task (resumed where they stopped), and its success. The base
    model is served once for all tasks."""
    import contextlib

    spec = screening_spec(runner.p)
    first, n = int(spec["dev_first"]), int(seeds or spec["dev_seeds"])
    out: dict[str, dict[str, Any]] = {t: {} for t in tasks}
    for arm in arms:
        if arm not in runner.p.arms:
            raise ProtocolError(f"the protocol has no arm {arm!r} to screen with")
        todo = [t for t in tasks if runner.state.episodes(screen_run(runner, t, arm)) < n]
        engine = runner.engine({}) if arm == "zero_shot" and todo else contextlib.nullcontext()
        with engine as url:
            for task in tasks:
                policy = [*runner.model_policy(url), "--mode", arm] if arm == "zero_shot" else runner.policy_arm(arm)
                runner.rollout(screen_run(runner, task, arm), (task,), first, n, 1, 0, policy, n)
                out[task][arm] = arm_success(runner, screen_run(runner, task, arm))
    return out


def screen(runner, output: Path, tasks: list[str] | None = None, arms: tuple[str, ...] = ("first_pages", *SCREEN_ARMS),
           seeds: int | None = None, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Screen ``tasks`` (default: every candidate) with ``arms`` and merge the figures into ``output``."""
    p = runner.p
    spec = screening_spec(p)
    tasks = p.tasks(tuple(tasks)) if tasks else candidates(p)
    measured: dict[str, dict[str, Any]] = {t: {} for t in tasks}
    if "first_pages" in arms:
        for task, row in screen_first_pages(p, list(tasks), echo).items():
            measured[task]["first_pages"] = row
    policy_arms = [a for a in arms if a in SCREEN_ARMS]
    if policy_arms:
        for task, row in screen_arms(runner, list(tasks), policy_arms, seeds).items():
            measured[task].update(row)
    # Read the file at the end, not the start: another screening call may have written it meanwhile.
    data = json.loads(output.read_text()) if output.exists() else {}
    for task, row in measured.items():
        data.setdefault("tasks", {}).setdefault(task, {}).update(row)
    for row in data.get("tasks", {}).values():
        row["breaks"] = verdict(row, spec["rules"])
    at = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    data.update({"protocol": p.name, "observation": p.interface["observation"], "max_steps": p.interface["max_steps"],
                 "dev_first": int(spec["dev_first"]), "rules": spec["rules"], "screened_at": at})
    data.setdefault("stages", []).append({"tasks": list(tasks), "arms": list(arms), "seeds": seeds or spec["dev_seeds"],
                                          **code_identity(), "at": at})
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(output)
    return data


def table(data: dict[str, Any]) -> str:
    """The screening's figures, one line per task."""
    lines = ["| task | first pages | in training | random | heuristic | zero-shot | breaks |", "| --- " * 7 + "|"]

    def rate(row, arm):
        a = row.get(arm)
        return "–" if not a or not a.get("episodes") else f"{a['successes']}/{a['episodes']}"

    for task, row in sorted(data.get("tasks", {}).items()):
        fp = row.get("first_pages") or {}
        pages = f"{fp['distinct_first_pages']}/{fp['dev_seeds']}" if fp else "–"
        lines.append(f"| {task.split('.', 1)[-1]} | {pages} | {fp.get('dev_pages_in_training_sample', '–')} | "
                     f"{rate(row, 'random')} | {rate(row, 'heuristic')} | {rate(row, 'zero_shot')} | "
                     f"{'; '.join(row.get('breaks') or []) or 'passes'} |")
    return "\n".join(lines)
