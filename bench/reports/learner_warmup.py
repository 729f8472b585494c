"""The persistent learner at 4 rows an optimizer step with --target-kl and --warmup-steps against its default, on
three training seeds (`python -m bench learner-warmup`, bench/protocols/learner-warmup.md): learner-minibatch's
tables."""

from __future__ import annotations

from bench.reports.learner_minibatch import report  # noqa: F401  (the same runs, measures and decision)
