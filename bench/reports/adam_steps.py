"""How far AdamW moves the weights per update, fresh per update against kept across updates (`python -m bench adam-steps`)."""

from __future__ import annotations

import pathlib

from bench.reports import load_runs, provenance, table


def report(results_dir: pathlib.Path) -> str:
    out = []
    for run in load_runs(results_dir):
        steps = list(run["rows"][0]["persistent"]) if run["rows"] else []
        rows = [[f"{row['snr']:g}", f"{row['job']:.1f}",
                 *(f"{row['persistent'][n]['steady']:.1f} ({row['persistent'][n]['ratio']:.2f}×); first {row['persistent'][n]['first']:.1f}"
                   for n in steps)] for row in run["rows"]]
        job_steps = run["rows"][0]["job_steps"] if run["rows"] else "?"
        out.append(table(["gradient signal / noise", f"job: {job_steps} fresh steps, rate decaying to 0",
                          *(f"persistent: {n} steps (/ job); its first update" for n in steps)], rows)
                   + f"\n- `{run['command']}`: {provenance(run)}; displacement per update in units of the learning "
                     f"rate, mean of {run['seeds']} runs of {run['updates']} updates over {run['params']:,} parameters "
                     "(the persistent learner's after its first update)\n")
    return "\n".join(out)
