"""Does online GRPO make the tiny model better on held-out task seeds? Start, random and final, in one run.

    .venv/bin/python -m bench online --task click-tab
    .venv/bin/python -m bench online --task click-button --hidden-size 128 --layers 3 --lr 1e-3
    .venv/bin/python -m bench online --task click-button --choice-labels --seeds-per-iteration 8 --group-size 4 \
        --warmup-seeds 16 --replay-iterations 3 --max-staleness 3 --lr 1e-3 --eval-seeds 20 --eval-attempts 2
    .venv/bin/python -m bench online --task click-tab --choice-labels --group-by state --cover-choices \
        --candidates-per-state 8 --group-size 1 --seeds-per-iteration 16 --warmup-seeds 8 --replay-iterations 2 \
        --max-staleness 2 --lr 5e-3 --batch-size 32 --eval-seeds 20 --eval-attempts 2
    .venv/bin/python -m bench online --task click-button --choice-labels --group-by state --cover-choices \
        --candidates-per-state 8 --group-size 1 --seeds-per-iteration 32 --warmup-seeds 8 --lr 2e-3 --lora-r 64 \
        --lora-alpha 64 --batch-size 32 --eval-seeds 20 --eval-attempts 2 --train-steps 32 --replay-iterations 4 \
        --max-staleness 4 --iterations 30

Set-up (all on CPU, nothing downloaded; the defaults are issue 11's set-up):
1. warm-up data: the random policy, ``--warmup-attempts`` times on each of ``--warmup-seeds`` task seeds (from
   50000 on) of the task;
2. the tiny model, fine-tuned on every valid step of those episodes (``--warmup-top-percent
   100``: the action format and page ids, not which element is right);
3. ``run_online`` from it: iteration k samples ``--group-size`` attempts on each of
   ``--seeds-per-iteration`` train task seeds, decoding constrained to the page's actions, on
   the compact page (``--observation elements``), rewarded for success only;
4. held-out success on task seeds 100000... (never trained on, never warmed up on) of the
   start model and of the random policy before the loop, and of the served version every
   ``--eval-every`` iterations: the curve.

With ``--choice-labels`` every choice names its element first (``# 'Tab #2'`` then ``click('21')``)
and step 2 imitates the same random steps written that way (``labelled_warm_start``). With ``--group-by state
--cover-choices`` each visited state's group is every action the page offers, scored from the restored state
(the last two commands above: the lab notes' "Covered choices" and "Run I", docs/notes/online-grpo-runs*.md).

With ``--cover-choices`` each iteration's line of the curve adds the sampling version's choice among the page's
choices (``choice_figures``). ``--wide-eval-seeds N`` measures start, random and the last version again on N
held-out seeds after the loop: a finished run's own command with it adds only that.

The figures are printed and written to bench/results/online/<time>.json. It is a
measurement, never a timed test. ``--workdir`` keeps everything, and running the same
command again resumes it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
WARMUP_SEED_START = 50_000


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench online", description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="click-button")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seeds-per-iteration", type=int, default=4, help="Train task seeds per iteration (a group each).")
    ap.add_argument("--max-episode-steps", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=8, help="Optimizer steps per update.")
    ap.add_argument("--batch-size", type=int, default=16, help="Rows per optimizer step of an update.")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-alpha", type=int, default=32, help="LoRA alpha (scale = alpha / r).")
    ap.add_argument("--lora-dropout", type=float, default=0.0,
                    help="LoRA dropout of the loop's updates (runs before 2026-11-27 trained with 0.05).")
    ap.add_argument("--warmup-seeds", type=int, default=8)
    ap.add_argument("--warmup-attempts", type=int, default=8, help="The random policy's attempts per warm-up task seed.")
    ap.add_argument("--warmup-steps", type=int, default=60)
    ap.add_argument("--warmup-top-percent", type=float, default=100.0,
                    help="bc_rows' cut for the warm-up SFT (100: every valid random step, a format-only warm start).")
    ap.add_argument("--hidden-size", type=int, default=64, help="Tiny model width.")
    ap.add_argument("--layers", type=int, default=2, help="Tiny model layers.")
    ap.add_argument("--vocab-size", type=int, default=1024, help="Tiny model BPE vocabulary.")
    ap.add_argument("--observation", choices=("axtree", "elements"), default="elements", help="The page in the prompt.")
    ap.add_argument("--reward-config", default=str(ROOT / "halo_agent" / "configs" / "rewards-success.yaml"),
                    help="Reward YAML of the loop's rollouts and updates ('default': HALO's dense default rewards).")
    ap.add_argument("--constrain-actions", action=argparse.BooleanOptionalAction, default=True,
                    help="Decode only the page's actions (structured-output choice).")
    ap.add_argument("--choice-labels", action=argparse.BooleanOptionalAction, default=False,
                    help="Each constrained choice names its element first (# 'Tab #2' then click('21')).")
    ap.add_argument("--group-by", choices=("episode", "state"), default="episode",
                    help="episode: the attempts of a task seed; state: candidates scored from each visited state.")
    ap.add_argument("--candidates-per-state", type=int, default=8, help="With --group-by state: the group size at a state.")
    ap.add_argument("--cover-choices", action=argparse.BooleanOptionalAction, default=False,
                    help="With --group-by state: a state's group is its offered choices, each once (see online-grpo).")
    ap.add_argument("--replay-iterations", type=int, default=1, help="Iterations' groups each update reads (this one included).")
    ap.add_argument("--max-staleness", type=int, default=1, help="Rows at most this many versions older than the updated weights.")
    ap.add_argument("--beta", type=float, default=0.0, help="KL coefficient against the base model.")
    ap.add_argument("--choice-softmax", action=argparse.BooleanOptionalAction, default=False,
                    help="Train each candidate's share of its state's choices, the distribution the engine draws from (see online-grpo).")
    ap.add_argument("--epsilon-high", type=float, help="Upper clip range of the importance ratio (default: the lower one, 0.2).")
    ap.add_argument("--seed", type=int, default=0, help="The loop's sampling and update seed (the start model and held-out seeds stay).")
    ap.add_argument("--train-seed-start", type=int, default=0, help="First train task seed (iteration k: + k x --seeds-per-iteration).")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-seeds", type=int, default=10)
    ap.add_argument("--eval-attempts", type=int, default=4)
    ap.add_argument("--eval-temperature", type=float, help="Temperature of the held-out evaluations (default: the loop's, 1).")
    ap.add_argument("--greedy-too", action="store_true",
                    help="After the loop, evaluate the start model and the last version at temperature 0 as well (each step's most likely action).")
    ap.add_argument("--wide-eval-seeds", type=int, default=0,
                    help="After the loop, start, random and the last served version again on this many held-out seeds "
                         "(the first --eval-seeds of them are the curve's own runs, read back): a verdict with a narrower interval.")
    ap.add_argument("--workdir", help="Where the lake, model and adapters go (default: a temporary folder).")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_train.online import OnlineConfig, Served, evaluate, open_engine, run_online
    from halo_train.tiny_model import build_tiny_model

    t0 = time.perf_counter()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="halo-online-"))
    lake = str(work / "lake")
    for seed in range(WARMUP_SEED_START, WARMUP_SEED_START + a.warmup_seeds):
        run_rollouts(RolloutConfig(env="miniwob", tasks=[a.task], rollouts_per_task=a.warmup_attempts, policy="random", observation=a.observation,
                                   max_steps=a.max_episode_steps, task_seed=seed, seed=seed, lake=lake,
                                   run_id=f"warmup-s{seed}", resume=True, progress=False))
    model = work / "tiny"
    if not (model / "halo_tiny_model.json").exists():  # a resumed run keeps the model its start was measured with
        if a.choice_labels:
            labelled_warm_start(model, lake, a)
        else:
            build_tiny_model(model, warmup_lake=lake, steps=a.warmup_steps, where="run_id like 'warmup-%'",
                             hidden_size=a.hidden_size, layers=a.layers, vocab_size=a.vocab_size, top_percent=a.warmup_top_percent)
    cfg = OnlineConfig(
        base_model=str(model), tasks=[a.task], iterations=a.iterations, group_size=a.group_size,
        max_episode_steps=a.max_episode_steps, train_steps=a.train_steps, lr=a.lr, serve=True, eval_every=a.eval_every,
        seeds_per_iteration=a.seeds_per_iteration, constrain_actions=a.constrain_actions, observation=a.observation,
        choice_labels=a.choice_labels, group_by=a.group_by, candidates_per_state=a.candidates_per_state,
        cover_choices=a.cover_choices, replay_iterations=a.replay_iterations, max_staleness=a.max_staleness, beta=a.beta, epsilon_high=a.epsilon_high, choice_softmax=a.choice_softmax,
        reward_config=None if a.reward_config == "default" else a.reward_config, lora_r=a.lora_r, lora_alpha=a.lora_alpha, lora_dropout=a.lora_dropout, batch_size=a.batch_size,
        eval_seeds=a.eval_seeds, eval_attempts=a.eval_attempts, eval_temperature=a.eval_temperature, seed=a.seed, train_seed_start=a.train_seed_start, lake=lake, output_dir=str(work / "out"),
        run_id="online", resume=(work / "out" / "online_run.json").exists(),
    )
    with open_engine(cfg, Path(cfg.output_dir)) as (engine, base_name):
        start = evaluate(cfg, engine, base_name, Served(None, 0), "online")
        random = evaluate(cfg, engine, base_name, Served(None, 0), "online", policy="random")
    print(f"{a.task}: held-out success before the loop: start {start:.0%}, random {random:.0%}", flush=True)
    stamps = [time.perf_counter()]

    def echo(line: str) -> None:
        stamps.append(time.perf_counter())
        print(f"[{stamps[-1] - stamps[-2]:.0f} s] {line}", flush=True)

    summary = run_online(cfg, echo=echo)
    # Seconds are the loop's own per-iteration record, so a resumed run keeps those of its earlier iterations.
    curve = [
        {"iteration": it["iteration"], "sampled_version": it["sampled_version"],
         "train_success": it["metrics"]["success_rate/train"], "heldout_success": it["metrics"].get("success_rate/heldout"),
         "frac_reward_zero_std": it["metrics"]["frac_reward_zero_std"], "updated": it["update"] == "trained",
         "seconds": it["metrics"].get("iteration_seconds")}
        for it in summary.iterations
    ]
    if a.cover_choices:  # each state's group is every choice the page offers: the policy's choice, state by state
        figures = choice_figures(lake, [it["rollout_run"] for it in summary.iterations])
        for c, it in zip(curve, summary.iterations):
            c.update(figures[it["rollout_run"]])
    final = next((c["heldout_success"] for c in reversed(curve) if c["heldout_success"] is not None), None)
    greedy = greedy_start_and_final(cfg, summary) if a.greedy_too else None
    wide = wide_start_random_and_final(cfg, summary, a.wide_eval_seeds) if a.wide_eval_seeds else None
    n = a.eval_seeds * a.eval_attempts
    result = {"task": a.task, "options": vars(a), "heldout_seeds": a.eval_seeds, "heldout_attempts": n,
              "start": start, "random": random, "final": final, "greedy": greedy, "wide": wide, "curve": curve,
              "seconds": time.perf_counter() - t0}
    print(f"\n{a.task}: held-out success ({a.eval_seeds} seeds x {a.eval_attempts} attempts, 95% intervals): "
          f"start {start:.0%} {wilson(start, n)}, random {random:.0%} {wilson(random, n)}, "
          f"final {'-' if final is None else f'{final:.0%} {wilson(final, n)}'}")
    if final is not None:
        print(f"{a.task}: final - start {100 * (final - start):+.0f} points, final - random {100 * (final - random):+.0f} points "
              f"(target: +25 over both)")
    if greedy:
        print(f"{a.task}: at temperature 0: start {greedy['start']:.0%}, final (version {greedy['version']}) {greedy['final']:.0%}")
    if wide:
        w = wide["attempts"]
        print(f"{a.task}: on {a.wide_eval_seeds} held-out seeds ({w} attempts): start {wide['start']:.0%} {wilson(wide['start'], w)}, "
              f"random {wide['random']:.0%} {wilson(wide['random'], w)}, final (version {wide['version']}) {wide['final']:.0%} "
              f"{wilson(wide['final'], w)}; final - start {100 * (wide['final'] - wide['start']):+.1f}, "
              f"final - random {100 * (wide['final'] - wide['random']):+.1f} points")
    print("iteration  version  train success  held-out  flat groups  updated" +
          ("  P(best)  P(best | named), 2+ named" if a.cover_choices else ""))
    for c in curve:
        held = "" if c["heldout_success"] is None else f"{c['heldout_success']:.0%}"
        print(f"{c['iteration']:>9}  {c['sampled_version']:>7}  {c['train_success']:>13.0%}  {held:>8}  "
              f"{c['frac_reward_zero_std']:>11.0%}  {str(c['updated']):>7}" +
              (f"  {fmt(c['p_best'])}  {fmt(c['p_best_given_named'])} ({c['states_2plus_named']} states)"
               if a.cover_choices else ""))
    (RESULTS / "online").mkdir(parents=True, exist_ok=True)
    out = RESULTS / "online" / f"{a.task}-{dt.datetime.now(dt.timezone.utc).strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"{result['seconds']:.0f} s; results in {out}")


def choice_figures(lake: str, rollout_runs: list[str]) -> dict[str, dict]:
    """How the sampling version chose at the states of each rollout run, from its covered groups (every choice of
    the page once, each with its sampled log-probability and its score): the softmax of the choices' log-probabilities
    is the policy's distribution over the page's choices. ``p_best``: its mass on the best-scoring choices, averaged
    over the states whose choices' scores differ. ``p_best_given_named``: the same among the choices that name
    their element (``# 'OK'``, not ``# textbox``), over the states with two or more of them whose best choice
    names one: on click-button, which button among the buttons."""
    from collections import defaultdict

    from halo_data.lake import Lake

    rows = Lake.open(lake).query_arrow(
        "select run_id, episode_id, step_idx, model_output, score, logprob_sum from candidates "
        "where list_contains($runs, run_id)", {"runs": list(rollout_runs)}).to_pylist()
    states: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        states[(r["run_id"], r["episode_id"], r["step_idx"])].append(r)
    p_best: dict[str, list[float]] = defaultdict(list)
    p_named: dict[str, list[float]] = defaultdict(list)
    for (run, _, _), group in states.items():
        if any(r["score"] is None or r["logprob_sum"] is None for r in group):
            continue  # a state that did not restore: scored by nothing
        best = max(r["score"] for r in group)
        if best == min(r["score"] for r in group):
            continue
        p_best[run].append(_mass(group, best))
        named = [r for r in group if (r["model_output"] or "").startswith("# '")]
        if len(named) >= 2 and any(r["score"] == best for r in named):
            p_named[run].append(_mass(named, best))
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {run: {"p_best": mean(p_best[run]), "p_best_given_named": mean(p_named[run]), "states": len(p_best[run]),
                  "states_2plus_named": len(p_named[run])} for run in rollout_runs}


def _mass(group: list[dict], best: float) -> float:
    """The softmax mass of a group's choices (by their log-probabilities) on those scoring ``best``."""
    top = max(r["logprob_sum"] for r in group)
    weights = [math.exp(r["logprob_sum"] - top) for r in group]
    return sum(w for w, r in zip(weights, group) if r["score"] == best) / sum(weights)


def fmt(p: float | None) -> str:
    return "    -" if p is None else f"{p:5.2f}"


def wilson(p: float, n: int, z: float = 1.96) -> str:
    """The 95% Wilson score interval of a success rate p over n attempts, as '[lo-hi%]'."""
    if n <= 0:
        return "[-]"
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"[{100 * max(0.0, centre - half):.0f}-{100 * min(1.0, centre + half):.0f}%]"


def greedy_start_and_final(cfg, summary) -> dict:
    """Held-out success at temperature 0 of the start model and of the version the loop served last."""
    import dataclasses

    return start_and_last(dataclasses.replace(cfg, eval_temperature=0.0), summary)


def wide_start_random_and_final(cfg, summary, seeds: int) -> dict:
    """Held-out success of the start model, the random policy and the version the loop served last, on ``seeds``
    held-out task seeds from --eval-seed-start: the curve's seeds and more. Every run is named as the loop names
    its own evaluations, so the seeds the curve already measured are read back, not sampled again."""
    import dataclasses

    wide = start_and_last(dataclasses.replace(cfg, eval_seeds=seeds), summary, with_random=True)
    return {"seeds": seeds, "attempts": seeds * cfg.eval_attempts, **wide}


def start_and_last(cfg, summary, with_random: bool = False) -> dict:
    """Held-out success (``cfg``'s evaluation) of the start model, the random policy where asked, and the version
    the loop served last."""
    from halo_train.online import Served, evaluate, open_engine

    last = summary.iterations[-1]["served_after"] if summary.iterations else {"name": None, "version": 0, "path": None}
    served = Served(last["name"], int(last["version"]), last["path"])
    with open_engine(cfg, Path(cfg.output_dir)) as (engine, base_name):
        out = {"start": evaluate(cfg, engine, base_name, Served(None, 0), "online")}
        if with_random:
            out["random"] = evaluate(cfg, engine, base_name, Served(None, 0), "online", policy="random")
        if served.name:
            engine.load_adapter(served.name, served.path)
        out["final"] = evaluate(cfg, engine, base_name, served, "online")
    return {**out, "version": served.version}


def labelled_warm_start(model: Path, lake: str, a: argparse.Namespace) -> None:
    """The format-only warm start for labelled choices: the same random-policy steps (``bc_rows``), each answer
    written as a labelled choice names its element (``# 'Tab #2'`` then ``click('21')``, the element's own name
    from the page the step saw, never the goal's). The random policy chose the element, so the warm start
    learns the answer's shape and that its label names one of the page's elements, not which one is right.
    Without it, the label tokens are untrained and the shortest label wins every choice."""
    import shutil

    import pyarrow as pa
    from trl import SFTConfig, SFTTrainer

    from halo_agent.actions import labelled_answer
    from halo_train.data import bc_dataset, read_view
    from halo_train.tiny_model import build_tiny_model
    from halo_train.trainer_utils import activation_checkpointing, quiet_hub

    quiet_hub()
    staging = model.with_name(model.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    build_tiny_model(staging, hidden_size=a.hidden_size, layers=a.layers, vocab_size=a.vocab_size)
    read = read_view(lake, "bc_rows", where="run_id like 'warmup-%'", view_params={"top_percent": float(a.warmup_top_percent)}, job_type="bc")
    rows = []
    for r in read.table.select(["prompt", "completion"]).to_pylist():
        page = json.loads(r["prompt"])[-1]["content"]
        answer = labelled_answer(r["completion"], page)
        if answer is not None:
            rows.append({"prompt": r["prompt"], "completion": answer})
    rows.sort(key=lambda r: (r["prompt"], r["completion"]))  # the view's order follows the lake's files: one model from one set of rows
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(staging)
    net = AutoModelForCausalLM.from_pretrained(staging)
    with tempfile.TemporaryDirectory(prefix="halo-labelled-warmup-") as tmp:
        args = SFTConfig(output_dir=tmp, max_steps=a.warmup_steps, per_device_train_batch_size=8, learning_rate=3e-3,
                         lr_scheduler_type="constant", warmup_steps=0, logging_steps=max(1, a.warmup_steps // 4),
                         save_strategy="no", report_to="none", seed=0, bf16=False, **activation_checkpointing(False),
                         max_length=None, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
        trainer = SFTTrainer(model=net, args=args, train_dataset=bc_dataset(pa.Table.from_pylist(rows)), processing_class=tokenizer)
        result = trainer.train()
    net.save_pretrained(staging)
    info = json.loads((staging / "halo_tiny_model.json").read_text())
    info["warmup"] = {"steps": a.warmup_steps, "rows": len(rows), "final_loss": float(result.training_loss),
                      "answers": "labelled choices", "lineage": read.lineage}
    (staging / "halo_tiny_model.json").write_text(json.dumps(info, indent=2, default=str))
    shutil.rmtree(model, ignore_errors=True)
    staging.rename(model)


if __name__ == "__main__":
    main()
