"""Whether a learner uses the descriptions of unnamed elements: BC on the same successful episodes, their prompts
rendered as learning-v2 saw them (``--observation elements-v2``) and with descriptions (``elements``).

    .venv/bin/python -m bench element-descriptions-bc                 # 3 tasks, random on 32 train seeds, BC, 20 test seeds
    .venv/bin/python -m bench element-descriptions-bc --train-seeds 16 --train-steps 16
    .venv/bin/python -m bench element-descriptions-bc --teacher goal_match --workdir runs/element-descriptions-bc-rule

The random policy reads no text, so on train task seeds 0 ... N-1 it plays the same episodes under both
observations; only their prompts differ. BC trains one LoRA adapter per observation on its run's successful
episodes (the same steps, the same actions, the same seed), and the model plays the test task seeds of
``python -m bench element-descriptions`` (400000 on) with each adapter under its own observation. Where the
descriptions carry what the goal refers to (whose trash icon, which folder), an adapter can learn to read them; without them
it can learn only positions. Per task and arm: successes on the test seeds, and the rows BC trained on. The lake,
the adapters and the engine's log stay in ``--workdir``; a re-run resumes.

``--teacher goal_match`` trains on the goal-match rule's successes instead: the rule reads the page, so with
descriptions it picks the icon whose description names the goal's sender, and the two observations' episodes
differ. It asks another question: whether the model can learn to read the descriptions when shown episodes that
use them, where the rule solves what random rarely does. Results go to
``bench/results/element-descriptions-bc/<time>.json``; ``python -m bench report element-descriptions-bc`` makes
the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from bench.element_descriptions import ARMS, FIRST_SEED, prepare, rollout, served, tally

TASKS = ("email-inbox-delete", "email-inbox-important", "navigate-tree")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench element-descriptions-bc", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated MiniWoB task names")
    ap.add_argument("--teacher", choices=("random", "goal_match"), default="random",
                    help="the policy whose successful train episodes BC reads")
    ap.add_argument("--train-seeds", type=int, default=32, help="train task seeds per task (0, 1, ...), one teacher episode each")
    ap.add_argument("--seeds", type=int, default=20, help=f"test task seeds per task, from {FIRST_SEED} on")
    ap.add_argument("--steps", type=int, default=6, help="actions per episode at most")
    ap.add_argument("--train-steps", type=int, default=32, help="BC optimizer steps (batch 8)")
    ap.add_argument("--lr", type=float, default=2e-4, help="BC learning rate")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the test episodes")
    ap.add_argument("--seed", type=int, default=0, help="the seed of sampling and training, the same for both observations")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a known model name (halo-train models) or a folder")
    ap.add_argument("--workers", type=int, default=2, help="rollout worker processes")
    ap.add_argument("--workdir", default="runs/element-descriptions-bc", help="the lake, adapters and engine log; a re-run resumes")
    a = ap.parse_args(argv)
    if min(a.train_seeds, a.seeds, a.steps, a.train_steps, a.workers) < 1 or a.temperature < 0 or a.lr <= 0:
        raise SystemExit("Error: the seeds, --steps, --train-steps and --workers must be at least 1, --lr above 0 "
                         "and --temperature not negative")
    from bench.reports import head_commit, save
    from halo_train import train_bc
    from halo_train.config import BCConfig

    tasks, folder, work, lake = prepare(a)
    commit, load_before, t0 = head_commit(), os.getloadavg(), time.perf_counter()
    sample = {arm: f"{a.teacher.replace('_', '-')}-{arm}-train" for arm in ARMS}
    bc_of = "bc" if a.teacher == "random" else f"bc-{a.teacher.replace('_', '-')}"
    tests = {task: {arm: f"{task}-{bc_of}-{arm}-t{a.temperature:g}-s{a.seed}" for arm in ARMS} for task in tasks}
    # 1. The teacher's episodes under both observations (random's are the same episodes: their prompts differ,
    # nothing else).
    sampling = argparse.Namespace(**{**vars(a), "seeds": a.train_seeds})
    for arm in ARMS:
        for task in tasks:
            rollout(lake, f"{sample[arm]}-{task}", task, a.teacher, None, None, arm, sampling, first_seed=0)
    samples = {arm: {task: tally(lake, f"{sample[arm]}-{task}") for task in tasks} for arm in ARMS}
    # 2. BC on each observation's successes, one adapter each.
    bc: dict[str, dict] = {}
    for arm in ARMS:
        out = work / f"{bc_of}-{arm}"
        runs = ", ".join(f"'{sample[arm]}-{task}'" for task in tasks)
        if not (out / "final" / "adapter_config.json").exists():
            train_bc(BCConfig(
                lake=lake, base_model=folder, output_dir=str(out), where=f"run_id IN ({runs}) AND success",
                top_percent=100, max_steps=a.train_steps, batch_size=8, lr=a.lr, lora_r=16, lora_alpha=32,
                lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], seed=a.seed,
                adapter_name=f"{bc_of}-{arm}"))
        stats = json.loads((out / "final" / "training_stats.json").read_text())  # this run's job or an earlier one's
        bc[arm] = {"rows": stats["rows"], "steps": stats["global_step"], "loss": stats["metrics"].get("train_loss")}
        print(f"BC {arm}: {bc[arm]['steps']} steps on {bc[arm]['rows']} rows -> {out / 'final'}", flush=True)
    # 3. Each adapter on the test seeds, under its own observation.
    with served(folder, work) as (url, model, engine):
        for arm in ARMS:
            swap = engine.swap_adapter(f"{bc_of}-{arm}", str((work / f"{bc_of}-{arm}" / "final").resolve()))
            if not swap.serving:
                raise SystemExit(f"Error: {swap.message}")
        for i, task in enumerate(tasks):
            for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):
                rollout(lake, tests[task][arm], task, "openai", url, model, arm, a, adapter=f"{bc_of}-{arm}")
            print(f"{task:24s} " + ", ".join(f"{arm} {(c := tally(lake, tests[task][arm]))['successes']}/{c['episodes']}"
                                             for arm in ARMS), flush=True)
    results = {task: {arm: tally(lake, tests[task][arm]) for arm in ARMS} for task in tasks}
    totals = {arm: {k: sum(results[t][arm][k] for t in tasks) for k in ("successes", "episodes", "steps")} for arm in ARMS}
    for arm in ARMS:
        print(f"BC, {arm:12s} {totals[arm]['successes']}/{totals[arm]['episodes']} test episodes succeeded")
    out = save("element-descriptions-bc", {
        "commit": commit, "model": a.model, "tasks": tasks, "teacher": a.teacher, "train_seeds": a.train_seeds, "seeds": a.seeds,
        "first_seed": FIRST_SEED, "steps": a.steps, "train_steps": a.train_steps, "lr": a.lr,
        "temperature": a.temperature, "seed": a.seed, "samples": samples, "bc": bc, "results": results,
        "totals": totals, "seconds": round(time.perf_counter() - t0, 1), "load_before": load_before,
        "load_after": os.getloadavg()}, argv if argv is not None else sys.argv[2:])
    print(f"results: {out}")


if __name__ == "__main__":
    main()
