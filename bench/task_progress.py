"""Task-aware progress against milestone progress: does each rank a partial solution above random clicking?

    python -m bench task-progress                         # GoMail, its default tasks
    python -m bench task-progress --site omnizon --random-episodes 4   # or --plans FILE --tasks ...

On a local REAL clone (``halo_agent.sites``), per task: a scripted partial solution, a
scripted full one where there is a plan, and ``--random-episodes`` episodes of the random
policy (same task seed, one policy seed each), all through HALO's episode loop into a lake
under a temporary folder. It prints, per episode, the sum of the milestone progress component
(``r_progress``), the sum of the task-aware one (``r_task_progress``: the share of the task's
expectations met at the end), success, the shaped return under the default weights, and the
episode's rank in ``progress_ranking`` (which ranks by task-aware progress where measured) and
by milestones alone; then what reading ``/finish`` cost per step.

``--plans FILE``: plans for other sites or tasks, YAML ``{task_id: {partial: [[click, NAME],
[fill, NAME, TEXT], [answer, TEXT]], full: [...]}}`` (``halo_agent.policies.scripted_policy``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.reports import save

# Plans on HALO's local GoMail clone (five emails: e1 Alice Chen, e2 Uber, e3 Brian King, e4 Amazon, e5 Notifications).
PLANS: dict[str, dict[str, dict[str, list[tuple[str, ...]]]]] = {
    "gomail": {
        # Mark all my emails as read and delete all amazon related emails.
        "v2.gomail-1": {
            "partial": [("click", "Alice Chen — Project kickoff"), ("click", "Back to inbox"),
                        ("click", "Uber Receipts — Your Friday evening trip with Uber"), ("click", "Back to inbox"),
                        ("click", "Delete Your order has shipped"), ("answer", "I read two emails and deleted the Amazon one.")],
        },
        # Clear any uber emails and notifications emails.
        "v2.gomail-2": {
            "partial": [("click", "Delete Your Friday evening trip with Uber"), ("answer", "I deleted the Uber email.")],
            "full": [("click", "Delete Your Friday evening trip with Uber"), ("click", "Delete Reminder: dentist appointment"),
                     ("answer", "I deleted the Uber and the notifications emails.")],
        },
        # Email Brian King and tell him to send me the meeting notes.
        "v2.gomail-18": {
            "partial": [("click", "Compose"), ("fill", "To", "brian.king@example.com"), ("fill", "Subject", "Meeting notes"),
                        ("fill", "Message Body", "Hi Brian, about our meeting."), ("click", "Send"), ("answer", "Emailed Brian.")],
            "full": [("click", "Compose"), ("fill", "To", "brian.king@example.com"), ("fill", "Subject", "Meeting notes"),
                     ("fill", "Message Body", "Hi Brian, could you please send me the meeting notes?"), ("click", "Send"),
                     ("answer", "I asked Brian King to send the meeting notes.")],
        },
    },
    # Plans on HALO's local Omnizon shop (product names as its catalog names them).
    "omnizon": {
        # Order me a nice cooking pot: the partial one puts the pot in the cart and never checks out.
        "v2.omnizon-13": {
            "partial": [("fill", "Search Omnizon", "cooking pot"), ("click", "Search"),
                        ("click", "T-fal Stainless Steel Cooking Pot, 8 Quart Stockpot with Lid"), ("click", "Add to Cart"),
                        ("answer", "The pot is in the cart.")],
            "full": [("fill", "Search Omnizon", "cooking pot"), ("click", "Search"),
                     ("click", "T-fal Stainless Steel Cooking Pot, 8 Quart Stockpot with Lid"), ("click", "Add to Cart"),
                     ("click", "Cart 1"), ("click", "Proceed to checkout"), ("click", "Place your order"),
                     ("answer", "I ordered an 8 quart cooking pot.")],
        },
        # Order me one of those comfortable neck pillows: the partial one reaches checkout and never places the order.
        "v2.omnizon-17": {
            "partial": [("fill", "Search Omnizon", "neck pillow"), ("click", "Search"),
                        ("click", "Contour Memory Foam Cervical Neck Pillow for Neck Pain Relief"), ("click", "Buy Now"),
                        ("answer", "The pillow is at checkout.")],
            "full": [("fill", "Search Omnizon", "neck pillow"), ("click", "Search"),
                     ("click", "Contour Memory Foam Cervical Neck Pillow for Neck Pain Relief"), ("click", "Buy Now"),
                     ("click", "Place your order"), ("answer", "I ordered a memory foam neck pillow.")],
        },
    },
    # Plans on HALO's local GoCalendar clone (the week of Tuesday, July 16, 2024).
    "gocalendar": {
        # Pick up my sister on Wednesday at 11 AM: the partial one types the event and never saves it.
        "v2.gocalendar-6": {
            "partial": [("click", "Create"), ("fill", "Title", "Pick up sister"), ("fill", "Start date", "Wednesday"),
                        ("fill", "Start time", "11 am"), ("answer", "Done.")],
            "full": [("click", "Create"), ("fill", "Title", "Pick up sister"), ("fill", "Start date", "Wednesday"),
                     ("fill", "Start time", "11 am"), ("click", "Save"), ("answer", "I added 'Pick up sister' on Wednesday at 11 AM.")],
        },
        # Cancel Wednesday's dinner with friends: the partial one opens it and closes it again.
        "v2.gocalendar-10": {
            "partial": [("click", "Dinner with Friends, 7:00 PM – 9:00 PM, Wednesday, July 17"), ("click", "Close"), ("answer", "Done.")],
            "full": [("click", "Dinner with Friends, 7:00 PM – 9:00 PM, Wednesday, July 17"), ("click", "Delete event"),
                     ("answer", "I deleted Wednesday's dinner with friends.")],
        },
    },
}

EPISODES_SQL = """
SELECT e.run_id, e.task_id, e.attempt_idx, e.success, e.n_steps, e.r_progress, e.final_task_progress, e.shaped_return,
       r.rank AS task_rank,
       rank() OVER (PARTITION BY e.task_id ORDER BY coalesce(e.success, false) DESC, e.final_progress DESC,
                    e.n_steps ASC) AS milestone_rank
FROM episodes AS e JOIN progress_ranking AS r USING (episode_id)
ORDER BY e.task_id, e.run_id, e.attempt_idx
"""
COST_SQL = """
SELECT task_id,
       CAST(json_extract(extra, '$.env_info.task_progress.poll_ms') AS DOUBLE) AS poll_ms,
       env_ms
FROM steps WHERE json_extract(extra, '$.env_info.task_progress') IS NOT NULL
"""


def load_plans(site: str, path: str | None) -> dict[str, dict[str, list[tuple[str, ...]]]]:
    plans = dict(PLANS.get(site, {}))
    if path:
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise SystemExit(f"error: {path} must map task ids to {{partial: [...], full: [...]}}")
        for task_id, kinds in data.items():
            plans[str(task_id)] = {k: [tuple(step) for step in v] for k, v in (kinds or {}).items()}
    return plans


def run(site: str, tasks: list[str], plans: dict, random_episodes: int, random_steps: int, lake_root: Path):
    from halo_agent.policies.random_policy import RandomPolicy
    from halo_agent.policies.scripted_policy import ScriptedPolicy
    from halo_agent.rollout import RolloutConfig, plan_episodes, resolve_tasks
    from halo_agent.rollout.workers import run_in_process
    from halo_agent.sites import LocalSite
    from halo_data.lake import Lake
    from halo_data.writer import EpisodeWriter

    lake = Lake.init(lake_root)
    with LocalSite(site) as server:
        def episodes(run_id: str, policy, n: int, max_steps: int) -> None:
            config = RolloutConfig(env="real", tasks=[task], rollouts_per_task=n, max_steps=max_steps, lake=str(lake_root),
                                   run_id=run_id, progress=False, env_options={"site_urls": {site: server.url}, "screenshot": False})
            todo = plan_episodes(config, run_id, resolve_tasks(config))
            writer = EpisodeWriter(lake)
            run_in_process(config, run_id, todo, lambda r: writer.write_episode(r.episode, r.steps, r.screenshots), policy)
            writer.close()

        for task in tasks:
            t0 = time.perf_counter()
            for kind in ("partial", "full"):
                plan = plans.get(task, {}).get(kind)
                if plan:
                    episodes(f"scripted-{kind}", ScriptedPolicy(plan, policy_version=f"scripted-{kind}"), 1, len(plan))
            episodes("random", RandomPolicy(seed=0), random_episodes, random_steps)
            print(f"{task}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return lake


def _f(x, digits=2) -> str:
    return "NULL" if x is None else f"{x:.{digits}f}"


def collect(lake) -> dict:
    """What the report is made of, read from the lake: per episode, the shaped returns at other weights, the cost rows."""
    return {"episodes": lake.query_arrow(EPISODES_SQL).to_pylist(), "cost": lake.query_arrow(COST_SQL).to_pylist(),
            "reweighted": {str(w): lake.query_arrow("SELECT task_id, run_id, shaped_return, final_task_progress FROM episodes",
                                                    params={"w_task_progress": w}).to_pylist() for w in (1.0, 2.0, 3.0, 4.0)}}


def report(data: dict) -> str:
    """The table, what each progress says of the partial solution against the random episodes, and the cost of reading /finish."""
    rows, cost = data["episodes"], data["cost"]
    lines = ["| task | episode | milestone progress | task-aware progress | success | shaped return | rank: task-aware | rank: milestones |",
             "|---|---|---:|---:|---|---:|---:|---:|"]
    verdicts = []
    by_task: dict[str, list[dict]] = {}
    for r in rows:
        by_task.setdefault(r["task_id"], []).append(r)
    for task, rs in by_task.items():
        n = len(rs)
        for r in rs:
            name = r["run_id"] if r["run_id"] != "random" else f"random #{r['attempt_idx']}"
            lines.append(f"| {task} | {name} | {_f(r['r_progress'])} | {_f(r['final_task_progress'])} | {bool(r['success'])} | "
                         f"{_f(r['shaped_return'])} | {r['task_rank']}/{n} | {r['milestone_rank']}/{n} |")
        partial = next((r for r in rs if r["run_id"] == "scripted-partial"), None)
        randoms = [r for r in rs if r["run_id"] == "random"]
        if partial and randoms:
            def above(key, higher_is_better=True):
                return sum(1 for x in randoms if (partial[key] or 0) > (x[key] or 0)) if higher_is_better else None
            verdicts.append(
                f"{task}: the partial solution scores above {above('final_task_progress')}/{len(randoms)} random episodes on "
                f"task-aware progress, {above('r_progress')}/{len(randoms)} on milestone progress, "
                f"{above('shaped_return')}/{len(randoms)} on the shaped return")
    # The shaped return at other weights of task_progress, re-weighted by the views (no new episodes).
    for w_text, shaped in data["reweighted"].items():
        w = float(w_text)
        parts = []
        for task in by_task:
            partial = next((r for r in shaped if r["task_id"] == task and r["run_id"] == "scripted-partial"), None)
            lower = [r for r in shaped if r["task_id"] == task and r["run_id"] == "random"
                     and partial and (r["final_task_progress"] or 0) < (partial["final_task_progress"] or 0)]
            if partial:
                parts.append(f"{task} {sum(partial['shaped_return'] > r['shaped_return'] for r in lower)}/{len(lower)}")
        verdicts.append(f"w_task_progress={w:g}: shaped return of the partial solution above the random episodes "
                        f"with a lower share: {', '.join(parts)}")
    polls = [c["poll_ms"] for c in cost if c["poll_ms"]]
    steps = [c["env_ms"] for c in cost if c["env_ms"] is not None]
    out = "\n".join(lines) + "\n\n" + "\n".join(f"- {v}" for v in verdicts)
    if polls:
        q = statistics.quantiles(polls, n=10) if len(polls) >= 10 else [max(polls)] * 9
        out += (f"\n\nreading /finish: {len(polls)} reads, median {statistics.median(polls):.0f} ms, p90 {q[8]:.0f} ms per step; "
                f"the environment step it is part of: median {statistics.median(steps):.0f} ms")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench task-progress", description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", default="gomail", help="a local clone of halo_agent.sites (gomail, omnizon, gocalendar)")
    parser.add_argument("--tasks", nargs="*", help="task ids (default: every task the site's plans cover)")
    parser.add_argument("--plans", help="YAML of plans: {task_id: {partial: [...], full: [...]}}")
    parser.add_argument("--random-episodes", type=int, default=6)
    parser.add_argument("--random-steps", type=int, default=15)
    parser.add_argument("--lake", help="keep the lake here (default: a temporary folder)")
    args = parser.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.WARNING)
    plans = load_plans(args.site, args.plans)
    tasks = args.tasks or sorted(plans)
    if not tasks:
        raise SystemExit(f"error: no plans for site {args.site!r}: give --plans FILE")
    with tempfile.TemporaryDirectory(prefix="halo-task-progress-") as tmp:
        root = Path(args.lake) if args.lake else Path(tmp) / "lake"
        lake = run(args.site, tasks, plans, args.random_episodes, args.random_steps, root)
        data = collect(lake)
    print(report(data))
    out = save("task-progress", {"site": args.site, "tasks": tasks, "random_episodes": args.random_episodes,
                                 "random_steps": args.random_steps, **data}, argv)
    print(f"results in {out}")


if __name__ == "__main__":
    main()
