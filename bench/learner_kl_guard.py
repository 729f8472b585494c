"""The persistent learner at 4 rows an optimizer step with ``--target-kl 0.02`` against its default (8 rows, no early
stop), on three training seeds: ``bench/protocols/learner-kl-guard.md``, committed before the first run.

    .venv/bin/python -m bench learner-kl-guard --workdir runs/learner-kl-guard

The runs, measures and decision rule are ``bench learner-minibatch``'s (``bench/learner_minibatch.py``), each arm a
minibatch size and a ``--target-kl``. Resumable with the same command; results go to bench/results/learner-kl-guard/.
"""

from __future__ import annotations

from bench.learner_minibatch import main as _run


def main(argv: list[str] | None = None) -> None:
    _run(argv, name="learner-kl-guard", target_kls="none,0.02", workdir="runs/learner-kl-guard")


if __name__ == "__main__":
    main()
