"""learning-v2's tables from its committed results (bench/results/learning-v2/): the task screening the protocol
was fixed on, then, once the experiment's episodes are exported, its report (success per arm, split and
temperature with intervals, the differences and targets; ``halo_train.experiment.report``).

    .venv/bin/python -m bench report learning-v2
"""

from __future__ import annotations

import json
import pathlib

PROTOCOL = pathlib.Path(__file__).resolve().parent.parent / "protocols" / "learning-v2.yaml"
SCREEN = "`halo-train experiment screen bench/protocols/learning-v2.yaml`"


def _rate(cell: dict | None) -> str:
    return "–" if not cell else f"{cell['successes']}/{cell['episodes']}"


def screening_table(results_dir: pathlib.Path) -> str:
    """The chosen tasks' screening figures, then how many candidates each rule left out."""
    path = results_dir / "screening.json"
    if not path.exists():
        return ""
    screen = json.loads(path.read_text())
    from halo_train.experiment.protocol import Protocol

    protocol = Protocol.load(PROTOCOL)
    rules = screen["rules"]
    commits = sorted({s["commit"][:10] for s in screen.get("stages", []) if s.get("commit")})
    out = [f"Task screening (dev seeds from {screen['dev_first']}, {screen['observation']} observation, at most "
           f"{screen['max_steps']} steps; screened by {screen['screened_at']}, its stages at {len(commits)} commits listed in "
           f"screening.json; "
           f"{SCREEN}). Rules: distinct first pages >= {rules['min_distinct_first_pages']:.0%}, dev first pages in the "
           f"training sample <= {rules['max_pages_in_training']:.0%}, zero-shot within "
           f"[{rules['zero_shot_min']:.0%}, {rules['zero_shot_max']:.0%}], random < {rules['random_max']:.0%}.", "",
           "| split | task | distinct first pages | in training sample | zero-shot | random | heuristic |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    tasks = screen["tasks"]
    for split, names in (("train", protocol.train_tasks), ("held-out", protocol.heldout_tasks)):
        for name in names:
            t = tasks.get(name) or tasks.get(f"miniwob.{name}") or {}
            pages = t.get("first_pages") or {}
            distinct = f"{pages['distinct_first_pages']}/{pages['dev_seeds']}" if pages else "–"
            seen = f"{pages['dev_pages_in_training_sample']}/{pages['dev_seeds']}" if pages else "–"
            out.append(f"| {split} | {name} | {distinct} | {seen} | {_rate(t.get('zero_shot'))} | "
                       f"{_rate(t.get('random'))} | {_rate(t.get('heuristic'))} |")
    left_out = sum(1 for t in tasks.values() if t.get("breaks"))
    out += ["", f"{len(tasks)} candidates screened, {left_out} left out by a rule (each one's reasons: "
                f"`bench/results/learning-v2/screening.json`)."]
    return "\n".join(out) + "\n"


def report(results_dir: pathlib.Path) -> str:
    parts = [screening_table(results_dir)]
    if (results_dir / "episodes.parquet").exists():
        from halo_train.experiment.protocol import Protocol
        from halo_train.experiment.report import report as experiment_report

        parts.append(experiment_report(Protocol.load(PROTOCOL), results_dir).split("\n", 2)[-1])
    else:
        parts.append("No episodes yet: the experiment's stages have not run "
                     "(`halo-train experiment run bench/protocols/learning-v2.yaml`).\n")
    return "\n".join(p for p in parts if p)
