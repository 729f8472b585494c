"""bench learner-minibatch's figures and decision: the protocol's rule (bench/protocols/learner-minibatch.md) applied
to runs' counts and metrics as the benchmark collects them, and the report made from the saved result."""

from __future__ import annotations

import json

import pytest

from bench.learner_minibatch import _arms, _options, by_size, compare
from bench.reports.learner_minibatch import report

ITERATIONS = 4


def _run(size: int, seed: int, sampled: list[tuple[int, int]], dev: list[tuple[int, int, int]], kl: list[float],
         clip: list[float]) -> dict:
    per = {"approx_kl": kl, "clip_ratio": clip, "displacement_from_previous": [0.02] * ITERATIONS,
           "optimizer_steps": [104 / size] * ITERATIONS, "rows_trained": [104.0] * ITERATIONS,
           "seconds_per_trained_row": [0.7] * ITERATIONS, "cpu_seconds_per_trained_row": [1.4] * ITERATIONS}
    return {"mini_batch_size": size, "seed": seed, "train_seed_start": 300_000 + 1000 * seed, "commit": "a" * 40,
            "started_at": "2026-12-06 17:08:00", "per_iteration": per,
            "sampled": [list(x) for x in sampled], "dev": [list(x) for x in dev]}


def _runs(candidate_sampled: int, candidate_dev: int, candidate_kl: float) -> dict:
    runs = {}
    for seed in (0, 1, 2):
        runs[f"mb8-s{seed}"] = _run(8, seed, [(10, 48), (12, 48), (15, 48), (16, 48)], [(2, 7, 24), (4, 9, 24)],
                                    [0.004] * ITERATIONS, [0.02] * ITERATIONS)
        runs[f"mb4-s{seed}"] = _run(4, seed, [(10, 48), (12, 48), (candidate_sampled, 48), (candidate_sampled, 48)],
                                    [(2, 8, 24), (4, candidate_dev, 24)], [0.01, candidate_kl, 0.01, 0.01],
                                    [0.03] * ITERATIONS)
    return runs


def _compare(runs: dict) -> dict:
    return compare(by_size(runs, 8, ITERATIONS), by_size(runs, 4, ITERATIONS), 8, 4)


def test_candidate_learning_as_well_and_stable_becomes_the_default():
    runs = _runs(candidate_sampled=18, candidate_dev=9, candidate_kl=0.02)
    eight = by_size(runs, 8, ITERATIONS)
    assert eight["primary"]["successes"] == 3 * (15 + 16) and eight["primary"]["episodes"] == 3 * 96
    assert eight["primary"]["iterations"] == [3, 4]
    assert [e["successes"] for e in eight["dev"]] == [21, 27] and eight["dev"][1]["episodes"] == 72
    assert eight["approx_kl_max"] == pytest.approx(0.004) and eight["optimizer_steps"] == pytest.approx(13.0)
    c = _compare(runs)
    d, lo, hi = c["primary_pooled"]
    assert d == pytest.approx((36 - 31) / 96) and lo < d < hi
    assert c["primary_seed_means"][0] == pytest.approx(d)  # the same rate on every seed: no spread between them
    assert c["dev_last_pooled"][0] == pytest.approx(0.0)
    assert c["checks"] == {"primary_not_lower": True, "dev_within_margin": True, "stable": True}
    assert c["decision"] == 4


@pytest.mark.parametrize("sampled, dev, kl, failed", [
    (14, 9, 0.02, "primary_not_lower"),   # learns less on new task seeds
    (18, 7, 0.02, "dev_within_margin"),   # 8.3 points below on the dev seeds
    (18, 9, 0.08, "stable"),              # one update's KL past 0.05
])
def test_any_failed_check_keeps_the_default(sampled, dev, kl, failed):
    c = _compare(_runs(sampled, dev, kl))
    assert [k for k, ok in c["checks"].items() if not ok] == [failed]
    assert c["decision"] == 8


def test_report_reads_the_saved_result(tmp_path):
    runs = _runs(candidate_sampled=18, candidate_dev=9, candidate_kl=0.02)
    result = {"benchmark": "learner-minibatch", "command": ".venv/bin/python -m bench learner-minibatch",
              "date": "2026-12-06 19:00 UTC", "machine": {"cores": 2, "load_average": [1.2]}, "commit": "a" * 40,
              "options": {"tasks": "click-option,choose-list", "max_episode_steps": 6, "group_size": 8,
                          "iterations": ITERATIONS, "lr": 5e-5, "seeds": "0,1,2", "eval_seed_start": 350_000,
                          "eval_seeds": 4, "eval_every": 2},
              "load_before": [1.0], "load_after": [1.2], "runs": runs,
              "sizes": {"8": by_size(runs, 8, ITERATIONS), "4": by_size(runs, 4, ITERATIONS)},
              "comparison": _compare(runs)}
    (tmp_path / "20261206-190000.json").write_text(json.dumps(result))
    text = report(tmp_path)
    assert "| 8 | 32.3 [" in text and "(93/288)" in text and "| 4 | 37.5 [" in text
    assert "4 − 8 rows a step, sampled success in iterations 3–4: +5.2 [" in text
    assert "decision: `--mini-batch-size 4`" in text
    assert "| mb4-s2 | 4 | 2 | 302000 | 10/48 12/48 18/48 18/48 | v2 8/24, v4 9/24 | 0.010 0.020 0.010 0.010 | aaaaaaaaaa |" in text
    runs["mb4-s2"]["per_iteration"]["early_stopped"] = [0.0, 1.0, 0.0, None]  # --target-kl stopped the second update
    (tmp_path / "20261206-190000.json").write_text(json.dumps(result))
    assert "| 0.010 0.020* 0.010 0.010 | aaaaaaaaaa |" in report(tmp_path)


def test_arms_are_a_size_a_target_kl_and_a_warmup_each():
    """bench learner-kl-guard and learner-warmup (bench/protocols/): arms labelled by their options, and the decision
    given as the options that become the defaults."""
    import argparse

    ap = argparse.ArgumentParser()
    arms = _arms(ap, [8, 4], "none,0.02")
    assert arms == {"8": (8, None, 0), "4+kl0.02": (4, 0.02, 0)}
    assert [_options(*arm) for arm in arms.values()] == ["--mini-batch-size 8", "--mini-batch-size 4 --target-kl 0.02"]
    assert _arms(ap, [8, 4], "none") == {"8": (8, None, 0), "4": (4, None, 0)}  # learner-minibatch's arms
    warmup = _arms(ap, [8, 4], "none,0.02", "0,16")  # bench learner-warmup (bench/protocols/learner-warmup.md)
    assert warmup == {"8": (8, None, 0), "4+kl0.02+wu16": (4, 0.02, 16)}
    assert _options(*warmup["4+kl0.02+wu16"]) == "--mini-batch-size 4 --target-kl 0.02 --warmup-steps 16"
    runs = _runs(candidate_sampled=18, candidate_dev=9, candidate_kl=0.02)
    for name in [n for n in runs if n.startswith("mb4-")]:
        runs[name]["arm"] = "4+kl0.02"
    c = compare(by_size(runs, "8", ITERATIONS), by_size(runs, "4+kl0.02", ITERATIONS), "8", "4+kl0.02")
    assert c["decision"] == "4+kl0.02" and by_size(runs, "4+kl0.02", ITERATIONS)["primary"]["episodes"] == 3 * 96
    with pytest.raises(SystemExit):
        _arms(ap, [8, 4], "none,0")  # a target must be positive
    with pytest.raises(SystemExit):
        _arms(ap, [8, 4], "none", "0,-1")  # a warm-up is 0 steps or more
