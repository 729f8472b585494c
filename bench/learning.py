"""The pre-registered learning experiments (bench/protocols/learning-vN.yaml), through ``halo-train experiment``.

    .venv/bin/python -m bench learning status                     # what is done, what is left
    .venv/bin/python -m bench learning register                   # the protocol at the code's commit
    nohup nice -n 15 .venv/bin/python -m bench learning run >> runs/learning-v1/run.log 2>&1 &
    .venv/bin/python -m bench learning export                     # bench/results/learning-v1/
    .venv/bin/python -m bench learning report                     # the tables and the curve (bench/reports/)

The runner is HALO's (``halo_train.experiment``; docs/learning.md): this keeps learning-v1's commands, its
default root (runs/NAME) and results folder (bench/results/NAME), and its report (bench/reports/learning_v1.py).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from halo_train.experiment.protocol import ProtocolError, load
from halo_train.experiment.record import ExperimentError
from halo_train.experiment.runner import Runner

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["Runner", "main"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench learning", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["run", "status", "export", "report", "register"])
    ap.add_argument("--protocol", default="learning-v1", help="a protocol name under bench/protocols or a file")
    ap.add_argument("--root", default=None, help="where the lake, adapters and logs go (default runs/NAME)")
    ap.add_argument("--results", default=None, help="export: the results folder (default bench/results/NAME)")
    ap.add_argument("--arms", default=None, help="run: only these arms, comma-separated")
    ap.add_argument("--seeds", default=None, help="run: only these training seeds, comma-separated")
    ap.add_argument("--workers", type=int, default=1, help="rollout worker processes (browsers)")
    ap.add_argument("--dry-run", action="store_true", help="run: print the commands instead of running them")
    args = ap.parse_args(argv)
    # SIGTERM (kill PID) ends the runner as Ctrl-C would: the running stage and the engine are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        protocol = load(args.protocol)
        root = Path(args.root or ROOT / "runs" / protocol.name)
        runner = Runner(protocol, root, workers=args.workers, dry_run=args.dry_run)
        results = Path(args.results or ROOT / "bench" / "results" / protocol.name)
        if args.command == "status":
            for row in runner.status():
                print(f"{row.stage:<48} {row}")
        elif args.command == "register":
            reg = runner.records.register(protocol)
            print(f"registered {protocol.name} at {reg['commit']} in {runner.records.registration_file}")
        elif args.command == "report":
            from bench.reports import learning_v1  # a protocol's results have learning-v1's shape whatever its name

            print(learning_v1.report(results))
        elif args.command == "export":
            from halo_train.experiment.export import export

            print(export(runner, results))
        else:
            runner.run(arms=args.arms.split(",") if args.arms else None,
                       seeds=[int(s) for s in args.seeds.split(",")] if args.seeds else None)
    except (ProtocolError, ExperimentError) as e:
        sys.exit(f"Error: {e}")


if __name__ == "__main__":
    main()
