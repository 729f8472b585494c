"""The persistent learner at 4 rows an optimizer step with ``--target-kl 0.02`` and ``--warmup-steps 16`` against its
default (8 rows, no early stop, no warm-up), on three training seeds: ``bench/protocols/learner-warmup.md``, committed
before the first run.

    .venv/bin/python -m bench learner-warmup --workdir runs/learner-warmup

The runs, measures and decision rule are ``bench learner-minibatch``'s (``bench/learner_minibatch.py``), each arm a
minibatch size, a ``--target-kl`` and ``--warmup-steps``. Resumable with the same command; results go to
bench/results/learner-warmup/.
"""

from __future__ import annotations

from bench.learner_minibatch import main as _run


def main(argv: list[str] | None = None) -> None:
    _run(argv, name="learner-warmup", target_kls="none,0.02", warmup_steps="0,16", workdir="runs/learner-warmup")


if __name__ == "__main__":
    main()
