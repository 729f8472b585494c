"""What the descriptions of unnamed elements give a model: zero-shot success with the elements observation as
learning-v2 saw it (``--observation elements-v2``) against today's (``elements``), on the same task seeds.

    .venv/bin/python -m bench element-descriptions                          # 6 tasks x 20 seeds, SmolLM2, temperature 1
    .venv/bin/python -m bench element-descriptions --tasks email-inbox-delete,navigate-tree --seeds 8

An element without an accessible name (an email's trash icon drawn by CSS, a folder's list item) is one ``image ''``
line in ``elements-v2``; ``elements`` describes it by what its markup calls it and the text it holds or sits in
(docs/agent.md). The model (HALO's chat server, decoding constrained to the page's actions, at most ``--steps``
actions) plays each task seed once under each observation, the arms alternating task by task, with one sampling
seed for both: where a task's prompts are the same under both (click-checkboxes names all its elements), the arms
draw the same episodes. The goal-match rule plays the same seeds under both observations (what the page lets a
rule that reads it do), and random too (it reads no text). Per task and arm: successes, and the model's prompt
tokens per step (what the descriptions cost). The lake and the engine's log stay in ``--workdir``; a re-run resumes
the runs there. Results go to ``bench/results/element-descriptions/<time>.json``; ``python -m bench report
element-descriptions`` makes the table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

# learning-v2's tasks whose pages have unnamed elements, social-media, and a control whose elements all have names.
TASKS = ("email-inbox-delete", "email-inbox-important", "navigate-tree", "click-widget", "social-media",
         "click-checkboxes")
ARMS = ("elements-v2", "elements")  # the model's arms, by their observation
# every arm: (policy, observation)
POLICIES = {"random": ("random", "elements"), "heuristic elements-v2": ("goal_match", "elements-v2"),
            "heuristic elements": ("goal_match", "elements"), **{arm: ("openai", arm) for arm in ARMS}}
FIRST_SEED = 400_000  # past every split of learning-v1 and learning-v2 (their test seeds start at 200000 and 250000)


def rollout(lake: str, run_id: str, task: str, policy: str, url: str | None, model: str | None, observation: str,
            a: argparse.Namespace, first_seed: int = FIRST_SEED, adapter: str | None = None) -> None:
    """``a.seeds`` episodes of ``task``, one per task seed from ``first_seed``, into run ``run_id`` (resumed)."""
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_data.lake import Lake
    from halo_data.runs import existing_run

    through_engine = (dict(model=model, adapter=adapter,
                           policy_options={"base_url": url, "constrain_actions": True, "timeout_s": 900.0})
                      if policy == "openai" else {})
    run_rollouts(RolloutConfig(
        env="miniwob", tasks=[task], rollouts_per_task=1, policy=policy, **through_engine, temperature=a.temperature,
        seed=a.seed, task_seed=first_seed, task_seeds=a.seeds, observation=observation, max_steps=a.steps,
        workers=a.workers, lake=lake, run_id=run_id, resume=existing_run(Lake.open(lake), run_id) is not None,
        kind="eval", progress=False, command="python -m bench element-descriptions",
    )).stop_if_interrupted()


def prepare(a: argparse.Namespace) -> tuple[list[str], str, Path, str]:
    """``a.tasks`` as MiniWoB names and ``a.model``'s folder, checked (one error line for either), and the lake in
    ``a.workdir``, created: (tasks, model folder, workdir, lake)."""
    from halo_agent.envs.base import UnknownTaskError
    from halo_agent.envs.miniwob import subdomain_of
    from halo_data.lake import Lake
    from halo_train.config import TrainConfigError, resolve_base_model

    try:
        tasks = [subdomain_of(t.strip()) for t in a.tasks.split(",") if t.strip()]
        folder = resolve_base_model(a.model, TrainConfigError)
    except (UnknownTaskError, TrainConfigError) as e:
        raise SystemExit(f"Error: {e}") from None
    work = Path(a.workdir)
    lake = str(work / "lake")
    Lake.init(lake)
    return tasks, folder, work, lake


@contextlib.contextmanager
def served(folder: str, work: Path) -> Iterator[tuple[str, str, Any]]:
    """HALO's chat server with the base model, for a block: its URL, the base model's served name and a client."""
    from halo_agent.serving import EngineClient
    from halo_train.served import _chat_server

    with _chat_server(folder, work / "engine.log") as url:
        engine = EngineClient(url)
        engine.wait_ready(timeout=600)
        yield url, next(name for name, card in engine.models().items() if not card.get("parent")), engine


def tally(lake: str, run_id: str) -> dict:
    """A run's successes, episodes, steps and prompt tokens per model step, and its per-seed outcomes."""
    from halo_data.lake import Lake

    db = Lake.open(lake)
    episodes = db.query_arrow(f"select task_seed, success from episodes where run_id = '{run_id}' order by task_seed").to_pylist()
    steps = db.query_arrow(f"select count(*) n, avg(prompt_tokens) tokens from steps where run_id = '{run_id}'").to_pylist()[0]
    return {"successes": sum(bool(e["success"]) for e in episodes), "episodes": len(episodes), "steps": int(steps["n"]),
            "prompt_tokens_per_step": None if steps["tokens"] is None else round(float(steps["tokens"]), 1),
            "by_seed": {str(e["task_seed"]): bool(e["success"]) for e in episodes}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench element-descriptions", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated MiniWoB task names")
    ap.add_argument("--seeds", type=int, default=20, help=f"task seeds per task, from {FIRST_SEED} on")
    ap.add_argument("--steps", type=int, default=6, help="actions per episode at most (learning-v2's 6)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (learning-v2's primary 1.0)")
    ap.add_argument("--seed", type=int, default=0, help="the sampling seed, the same for both observations")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a known model name (halo-train models) or a folder")
    ap.add_argument("--workers", type=int, default=2, help="rollout worker processes")
    ap.add_argument("--workdir", default="runs/element-descriptions", help="the lake and the engine's log; a re-run resumes")
    a = ap.parse_args(argv)
    if a.seeds < 1 or a.steps < 1 or a.workers < 1 or a.temperature < 0:
        raise SystemExit("Error: --seeds, --steps and --workers must be at least 1 and --temperature not negative")
    from bench.reports import head_commit, save
    from halo_data.lake import Lake

    tasks, folder, work, lake = prepare(a)
    commit, load_before, t0 = head_commit(), os.getloadavg(), time.perf_counter()
    runs = {task: {arm: f"{task}-{arm.replace(' ', '-')}-t{a.temperature:g}-s{a.seed}" for arm in POLICIES} for task in tasks}
    with served(folder, work) as (url, model, _):
        for i, task in enumerate(tasks):
            order = ARMS if i % 2 == 0 else ARMS[::-1]  # alternating, so neither observation always runs first
            for arm in order:
                rollout(lake, runs[task][arm], task, "openai", url, model, arm, a)
            for arm, (policy, observation) in POLICIES.items():
                if policy != "openai":
                    rollout(lake, runs[task][arm], task, policy, None, None, observation, a)
            cells = {arm: tally(lake, run) for arm, run in runs[task].items()}
            print(f"{task:24s} " + ", ".join(f"{arm} {c['successes']}/{c['episodes']}" for arm, c in cells.items()), flush=True)
    results = {task: {arm: tally(lake, run) for arm, run in by_arm.items()} for task, by_arm in runs.items()}
    totals = {arm: {k: sum(results[t][arm][k] for t in tasks) for k in ("successes", "episodes", "steps")}
              for arm in POLICIES}
    for arm in ARMS:  # over every step of the arm, whichever task it came from
        ids = ", ".join(f"'{runs[t][arm]}'" for t in tasks)
        mean = Lake.open(lake).query_arrow(f"select avg(prompt_tokens) t from steps where run_id in ({ids})").column("t")[0].as_py()
        totals[arm]["prompt_tokens_per_step"] = None if mean is None else round(float(mean), 1)
    v2, v3 = totals["elements-v2"]["prompt_tokens_per_step"], totals["elements"]["prompt_tokens_per_step"]
    ratios = {"prompt_tokens_per_step": round(v3 / v2, 2) if v2 and v3 else None}
    for arm, total in totals.items():
        print(f"{arm:12s} {total['successes']}/{total['episodes']} episodes succeeded, {total['steps']} steps")
    print(f"elements / elements-v2: {ratios['prompt_tokens_per_step']}x the prompt tokens per step")
    out = save("element-descriptions", {
        "commit": commit, "model": a.model, "tasks": tasks, "seeds": a.seeds, "first_seed": FIRST_SEED, "steps": a.steps,
        "temperature": a.temperature, "seed": a.seed, "workers": a.workers, "results": results, "totals": totals,
        "ratios": ratios, "seconds": round(time.perf_counter() - t0, 1), "load_before": load_before,
        "load_after": os.getloadavg()}, argv if argv is not None else sys.argv[2:])
    print(f"results: {out}")


if __name__ == "__main__":
    main()
