"""Whether a MiniWoB++ episode repeats however fast the policy answers: the environment's settle wait against none.

    .venv/bin/python -m bench miniwob-settle                    # learning-v2's 10 tasks and click-collapsible-2, 16 seeds, a 0.5 s answer
    .venv/bin/python -m bench miniwob-settle --tasks click-collapsible,navigate-tree --seeds 20 --pause 1.0

A policy's speed is the machine's load seen from the page: a model answers in 0.1 s idle and in seconds beside a
training job. ``MiniWoBEnv`` waits after each action (and reset) for the page's animations to end, up to
``settle_ms``; without the wait, a click that lands while an accordion still moves does what the policy's speed
decides. For each task and seed, the random policy (its choices seeded by the task and seed) plays an episode of at
most ``--steps`` actions twice: answering at once, and answering ``--pause`` seconds after each observation. An
episode repeats when both plays took the same actions with the same rewards and saw the same pages (AXTree text).
Two arms, side by side in one run: ``settle_ms=0`` (observe at once) and the default wait. Per arm: episodes that
repeat, episodes whose success differs, and the environment's seconds per step (the pause not counted). Results go to
``bench/results/miniwob-settle/<time>.json``; ``python -m bench report miniwob-settle`` makes the table.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import time

# learning-v2's train and held-out tasks (bench/protocols/learning-v2.yaml), and the other accordion.
TASKS = ("click-checkboxes", "choose-list", "click-collapsible", "navigate-tree", "email-inbox-delete", "count-shape",
         "click-checkboxes-soft", "email-inbox-important", "click-widget", "email-inbox-noscroll", "click-collapsible-2")


def play(env, task: str, seed: int, steps: int, pause_s: float) -> dict:
    """One random-policy episode; its trajectory (action, reward, page hash per step) and the env's seconds."""
    from halo_agent.envs.miniwob import MiniWoBEnv
    from halo_agent.policies.random_policy import action_for

    rng = random.Random(f"{task}/{seed}")
    page = env.reset(MiniWoBEnv.task_spec(task), seed)
    trajectory, env_seconds, success = [], 0.0, False
    for _ in range(steps):
        if not page.elements:
            break
        action = action_for(rng.choice(list(page.elements)), rng)
        time.sleep(pause_s)  # the policy thinking, while the page goes on
        start = time.perf_counter()
        out = env.step(action)
        env_seconds += time.perf_counter() - start
        page = out.page
        trajectory.append((action, out.reward, hashlib.sha256(page.axtree.encode()).hexdigest()[:16]))
        if out.terminated:
            success = out.reward > 0
            break
    return {"trajectory": trajectory, "success": success, "env_seconds": env_seconds}


def measure(settle_ms: int, tasks: list[str], seeds: int, steps: int, pause_s: float) -> dict:
    from halo_agent.envs.miniwob import MiniWoBEnv

    env = MiniWoBEnv(screenshots=False, settle_ms=settle_ms)
    per_task: dict[str, dict] = {}
    env_seconds, env_steps = 0.0, 0
    try:
        for task in tasks:
            repeats, success_differs, successes, task_seconds, task_steps = 0, 0, [0, 0], 0.0, 0
            for seed in range(seeds):
                at_once, slow = play(env, task, seed, steps, 0.0), play(env, task, seed, steps, pause_s)
                repeats += at_once["trajectory"] == slow["trajectory"]
                success_differs += at_once["success"] != slow["success"]
                successes[0] += at_once["success"]
                successes[1] += slow["success"]
                for p in (at_once, slow):
                    task_seconds += p["env_seconds"]
                    task_steps += len(p["trajectory"])
            env_seconds, env_steps = env_seconds + task_seconds, env_steps + task_steps
            per_task[task] = {"episodes": seeds, "repeat": repeats, "success_differs": success_differs,
                              "successes_at_once": successes[0], "successes_slow": successes[1], "env_steps": task_steps,
                              "env_seconds_per_step": round(task_seconds / max(task_steps, 1), 4)}
            print(f"settle_ms={settle_ms:<5} {task:24s} {repeats}/{seeds} repeat, success differs in {success_differs}", flush=True)
    finally:
        env.close()
    return {"settle_ms": settle_ms, "tasks": per_task,
            "episodes": seeds * len(tasks), "repeat": sum(t["repeat"] for t in per_task.values()),
            "success_differs": sum(t["success_differs"] for t in per_task.values()),
            "env_steps": env_steps, "env_seconds_per_step": round(env_seconds / max(env_steps, 1), 4)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench miniwob-settle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated MiniWoB task names")
    ap.add_argument("--seeds", type=int, default=16, help="task seeds per task (0, 1, ...)")
    ap.add_argument("--steps", type=int, default=6, help="actions per episode at most")
    ap.add_argument("--pause", type=float, default=0.5, help="seconds the slow policy takes to answer")
    a = ap.parse_args(argv)
    if a.seeds < 1 or a.steps < 1 or a.pause <= 0:
        raise SystemExit("Error: --seeds and --steps must be at least 1 and --pause above 0")
    from bench.reports import save
    from halo_agent.envs.miniwob import DEFAULT_SETTLE_MS, subdomain_of
    from halo_agent.envs.base import UnknownTaskError

    try:
        tasks = [subdomain_of(t.strip()) for t in a.tasks.split(",") if t.strip()]
    except UnknownTaskError as e:
        raise SystemExit(f"Error: {e}") from None
    load_before = os.getloadavg()
    arms = {name: measure(settle, tasks, a.seeds, a.steps, a.pause)
            for name, settle in (("observe at once", 0), ("settle", DEFAULT_SETTLE_MS))}
    off, on = arms["observe at once"], arms["settle"]
    ratios = {"env_seconds_per_step": round(on["env_seconds_per_step"] / max(off["env_seconds_per_step"], 1e-9), 2)}
    for name, arm in arms.items():
        print(f"{name:16s} {arm['repeat']}/{arm['episodes']} episodes repeat, success differs in {arm['success_differs']}, "
              f"{arm['env_seconds_per_step']:.3f} s per env step")
    print(f"settle / observe at once: {ratios['env_seconds_per_step']}x the seconds per env step")
    out = save("miniwob-settle", {"tasks": tasks, "seeds": a.seeds, "steps": a.steps, "pause_s": a.pause, "arms": arms,
                                  "ratios": ratios, "load_before": load_before, "load_after": os.getloadavg()},
               argv if argv is not None else sys.argv[2:])
    print(f"results: {out}")


if __name__ == "__main__":
    main()
