"""The README's main job, end to end on a small scale: rollouts -> lake -> views -> training -> summary."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_quickstart_fills_the_lake_and_trains_every_job(tmp_path):
    from halo_agent.quickstart import QuickstartConfig, run_quickstart
    from halo_data.lake import Lake

    lines: list[str] = []
    cfg = QuickstartConfig(
        lake=str(tmp_path / "lake"),
        output_dir=str(tmp_path / "out"),
        tasks=("miniwob.click-test", "miniwob.click-button", "miniwob.click-dialog"),
        rollouts_per_task=3,
        max_steps=5,
        warmup_steps=4,
        train_steps=1,
        progress=False,
    )
    summary = run_quickstart(cfg, echo=lines.append)

    assert summary.views["episodes"] == 9
    assert summary.views["bc_rows"] > 0
    assert summary.views["grpo_groups (episode level)"] == 3
    lake = Lake.open(cfg.lake)
    kinds = {r["kind"]: r["n"] for r in lake.query_arrow("select kind, count(*) n from runs group by kind").to_pylist()}
    metrics = lake.query_arrow("select count(distinct run_id) n from train_metrics").column("n")[0].as_py()
    trained = [j for j, r in summary.jobs.items() if r["status"] == "trained"]
    assert "bc" in trained and "grpo" in trained
    assert kinds == {"rollout": 1, "train": len(trained)}
    assert metrics == len(trained)
    for job in trained:
        assert (tmp_path / "out" / job / "final" / "adapter_model.safetensors").exists()
    assert any(line.startswith("Summary") for line in lines)
    assert any("frac_reward_zero_std" in line for line in lines)

    # Running it again resumes the rollout run: nothing is collected twice.
    again = run_quickstart(QuickstartConfig(**{**cfg.__dict__, "jobs": ()}), echo=lines.append)
    assert again.rollout["episodes_written"] == 0
    assert again.views["episodes"] == 9
