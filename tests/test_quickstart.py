"""The README's main job, end to end on a small scale: rollouts -> lake -> views -> training -> summary."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_quickstart_fills_the_lake_and_trains_every_job(tmp_path, capfd):
    from halo_train.quickstart import QuickstartConfig, run_quickstart
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
    # one line per job, and no trainer log dicts between the progress bars (they are in train_metrics)
    assert [line.split(":")[0].strip() for line in lines if " steps on " in line] == trained
    printed = capfd.readouterr()
    assert "'loss'" not in printed.out + printed.err and '"loss"' not in printed.out + printed.err
    assert "bc: 100%" in printed.err

    # the "Next:" commands run as printed (all but the dashboard, a server, and vllm, a GPU host's)
    nexts = lines[lines.index("Next:") + 1:]
    runnable = [line.strip() for line in nexts if "halo-data" in line and "dashboard" not in line]
    assert len(runnable) == 2
    for line in runnable:
        done = subprocess.run(line, shell=True, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.startswith("["), (line, done.stderr)

    # Running it again resumes the rollout run: nothing is collected twice.
    again = run_quickstart(QuickstartConfig(**{**cfg.__dict__, "jobs": ()}), echo=lines.append)
    assert again.rollout["episodes_written"] == 0
    assert again.views["episodes"] == 9


def test_quickstart_with_a_model_trains_on_its_successes_and_evaluates_beside_zero_shot_and_random(tmp_path, tiny_lora_models):
    # `--model smollm2-135m-instruct` runs this with the real model (minutes); a tiny model folder runs the same path.
    from halo_data.lake import Lake
    from halo_train.quickstart_model import ModelQuickstartConfig, run_model_quickstart

    base_dir, _ = tiny_lora_models
    lines: list[str] = []
    cfg = ModelQuickstartConfig(model=base_dir, lake=str(tmp_path / "lake"), output_dir=str(tmp_path / "out"),
                                tasks=("miniwob.click-test",), task_seeds=1, rollouts_per_task=3, eval_seeds=1,
                                eval_attempts=1, max_steps=2, train_steps=1, workers=1, progress=False)
    summary = run_model_quickstart(cfg, echo=lines.append)

    lake = Lake.open(cfg.lake)
    kinds = {r["run_id"]: r["kind"] for r in lake.query_arrow("select run_id, kind from runs", views=False).to_pylist()}
    runs = {r["run_id"]: (kinds[r["run_id"]], r["n"])
            for r in lake.query_arrow("select run_id, count(*) n from episodes group by run_id").to_pylist()}
    ok, n = summary.train_successes
    assert n == 3 and runs[summary.runs["zero-shot"]] == ("rollout", 3)
    assert runs[summary.runs["eval zero-shot"]] == ("eval", 1) and runs[summary.runs["eval random"]] == ("eval", 1)
    assert (tmp_path / "out" / "engine.log").exists()
    if ok:  # BC learned from the successful episodes only, and its adapter played the held-out seeds
        assert summary.bc["rows"] == lake.query_arrow(
            f"select count(*) n from bc_rows where run_id = '{summary.runs['zero-shot']}' and success", params={"top_percent": 100}
        ).column("n")[0].as_py() > 0
        assert runs[summary.runs["eval bc"]] == ("eval", 1)
        assert (tmp_path / "out" / "bc" / "final" / "adapter_model.safetensors").exists()
    else:
        assert "skipped" in summary.bc and summary.runs["eval bc"] not in runs
    table = lines[lines.index(next(line for line in lines if line.startswith("Summary"))) + 1:]
    assert table[0].split() == ["task", "BC", "adapter", "zero-shot", "random"]
    assert table[1].split()[0] == "click-test" and table[2].split()[0] == "all"
    # The comparison says how sure it is: intervals on the pooled rates, and whether the differences are beyond chance.
    assert table[3].startswith("  95% intervals") and "zero-shot" in table[3] and "random" in table[3]
    difference = next(line for line in table if line.startswith("  zero-shot - random:"))
    assert " points [" in difference and ("cannot tell them apart" in difference or " is " in difference)
    # The same summary as data: counts per policy and task, pooled rates, the differences and their verdicts.
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["success"]["zero-shot"] == {"miniwob.click-test": [*summary.success["zero-shot"]["miniwob.click-test"]]}
    assert saved["pooled"]["random"]["episodes"] == 1 and saved["config"]["tasks"] == ["miniwob.click-test"]
    verdict = next(d["verdict"] for d in saved["differences"] if d["policy"] == "zero-shot" and d["against"] == "random")
    assert difference.endswith(verdict)
    # click-test shows the same page on every seed: the held-out episode starts on a page the training run saw.
    assert saved["seen_in_training"]["episodes"] == 1 and saved["seen_in_training"]["first_pages_seen"] == 1
    assert any(line.startswith("  seen in training     held-out first pages 1/1 episodes") for line in lines)
    assert any(line.endswith(f"the summary as data: {tmp_path / 'out' / 'summary.json'}") for line in lines)
