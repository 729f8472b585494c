"""bench learning: the pre-registered experiment's runner on a small protocol — real rollouts in Chromium into a real
lake, resumed from the lake alone, exported and reported; the statistics it registered."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from bench.learning import Runner
from bench.learning_protocol import Protocol, ProtocolError, load
from halo_data.prompts import PROMPT_VERSIONS
from halo_data.stats import mean_interval, newcombe, welch_interval, wilson

REPO = Path(__file__).resolve().parent.parent


def small_protocol(tmp_path: Path, **changes) -> Path:
    """learning-v1's own file with the tasks, seeds and budgets cut to a few episodes."""
    raw = yaml.safe_load((REPO / "bench" / "protocols" / "learning-v1.yaml").read_text())
    raw.update(name="learning-small", tasks={"train": ["click-button"], "heldout": ["click-test"]})
    raw["splits"]["test"].update(train_tasks_seeds=2, heldout_tasks_seeds=2)
    raw["splits"]["dev"].update(curve_seeds=1)
    raw["interface"]["max_steps"] = 3
    raw["interface"]["prompt_version"] = PROMPT_VERSIONS[raw["interface"]["observation"]]  # what this code renders
    raw.update(changes)
    path = tmp_path / "learning-small.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_registered_protocol_loads_and_keeps_its_promises():
    p = load("learning-v1")
    assert p.base_model == "smollm2-135m-instruct" and len(p.training_seeds) >= 3
    assert len(p.train_tasks) >= 6 and len(p.heldout_tasks) >= 4 and not set(p.train_tasks) & set(p.heldout_tasks)
    assert int(p.splits["test"]["first"]) >= 200000
    for arm in p.arms:
        for seed in p.arm_seeds(arm):
            for cell in p.eval_cells(arm, seed):
                assert cell.split == "dev" or cell.episodes >= 200
    online = p.hyperparameters["online_grpo"]
    online_episodes = online["iterations"] * online["seeds_per_iteration"] * online["group_size"] * len(p.train_tasks)
    sample = p.budget["sample"]
    assert online_episodes == sample["task_seeds"] * sample["attempts"] * len(p.train_tasks) == p.budget["episodes"]


def test_a_protocol_that_trains_on_a_held_out_task_or_overlaps_splits_is_refused(tmp_path):
    with pytest.raises(ProtocolError, match="held-out tasks are trained on"):
        Protocol.load(small_protocol(tmp_path, tasks={"train": ["click-button"], "heldout": ["click-button"]}))
    raw = yaml.safe_load(small_protocol(tmp_path).read_text())
    raw["splits"]["dev"]["first"] = 5
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ProtocolError, match="splits overlap"):
        Protocol.load(tmp_path / "bad.yaml")


def test_a_protocol_naming_prompts_this_code_does_not_render_is_refused_before_it_registers_or_runs(tmp_path):
    """learning-v2 names the prompts it was run with; this code renders the elements observation with descriptions
    (halo-prompt-v3-elements), so the protocol neither registers nor runs here, in one line. The elements-v2
    observation renders learning-v2's prompts."""
    import subprocess
    import sys

    raw = yaml.safe_load(small_protocol(tmp_path).read_text())
    raw["interface"]["prompt_version"] = "halo-prompt-v2-elements"
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(raw))
    p = Protocol.load(tmp_path / "old.yaml")  # status, export and report still read it
    with pytest.raises(ProtocolError, match="prompt_version is halo-prompt-v2-elements, but this code renders"):
        p.check_prompt_version()
    root = tmp_path / "root"
    for command in ("register", "run"):
        done = subprocess.run([sys.executable, "-m", "halo_train.experiment", command, str(tmp_path / "old.yaml"),
                               "--root", str(root)], capture_output=True, text=True, cwd=REPO)
        assert done.returncode != 0 and not (root / "experiment.json").exists()
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "halo-prompt-v3-elements: a protocol with observation elements-v2 renders it" in lines[0]
    Protocol.load(small_protocol(tmp_path)).check_prompt_version()  # the current version passes
    raw["interface"]["observation"] = "elements-v2"  # the old prompts, by their observation's name
    (tmp_path / "v2.yaml").write_text(yaml.safe_dump(raw))
    Protocol.load(tmp_path / "v2.yaml").check_prompt_version()


def test_intervals_match_their_textbook_values():
    lo, hi = wilson(0, 10)
    assert lo == 0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson(15, 20)
    assert (lo, hi) == (pytest.approx(0.5313, abs=1e-4), pytest.approx(0.8881, abs=1e-4))
    # Newcombe 1998, example (56/70 - 48/80): 0.2 [0.0524, 0.3339]
    d, lo, hi = newcombe(56, 70, 48, 80)
    assert (d, lo, hi) == (pytest.approx(0.2), pytest.approx(0.0524, abs=1e-3), pytest.approx(0.3339, abs=1e-3))
    m, lo, hi = mean_interval([0.5, 0.6, 0.7])
    assert m == pytest.approx(0.6) and hi - m == pytest.approx(4.303 * 0.1 / math.sqrt(3), rel=1e-3)
    assert mean_interval([0.4]) == (0.4, None, None)
    d, lo, hi = welch_interval([0.5, 0.6, 0.7], [0.3])  # a single-policy arm contributes no spread
    assert d == pytest.approx(0.3) and (hi - d) == pytest.approx(4.303 * 0.1 / math.sqrt(3), rel=1e-3)


def test_trained_arms_are_never_evaluated_before_their_training_is_final(tmp_path):
    runner = Runner(load(small_protocol(tmp_path)), tmp_path / "root", dry_run=True)
    runner.run()
    commands = (tmp_path / "root" / "commands.log").read_text()
    assert "halo-train bc" in commands and "halo-train dpo" in commands and "halo-train online-grpo" in commands
    assert "lsv1-eval-zero_shot-s0-test_seeds" in commands
    for arm in ("bc_filtered", "dpo", "online_grpo"):
        assert f"-eval-{arm}-" not in commands  # no final adapter: no evaluation, test seeds least of all
    assert "--train-seed-start 20000" in commands and "--eval-seed-start 160000" in commands


@pytest.fixture(scope="module")
def policy_arms(tmp_path_factory):
    """The random and heuristic arms of the small protocol, run once into a real lake."""
    from test_experiment import git_repo

    tmp = tmp_path_factory.mktemp("learning")
    runner = Runner(load(small_protocol(tmp)), tmp / "root", code_dir=git_repo(tmp / "code"))
    runner.records.register(runner.p)  # a stage runs only at the commit its protocol is registered at
    runner.run(arms=["random", "heuristic"])
    return runner


@pytest.mark.browser
@pytest.mark.slow
def test_policy_arms_run_once_and_resume_from_the_lake_alone(policy_arms):
    runner = policy_arms
    log = runner.root / "commands.log"
    assert len(log.read_text().splitlines()) == 4  # 2 arms x (test seeds, held-out tasks)
    assert {str(r) for r in runner.status() if "-eval-random-" in r.stage or "-eval-heuristic-" in r.stage} == {"2/2"}
    again = Runner(runner.p, runner.root, code_dir=runner.records.code_dir)  # a new process knows only the lake
    again.run(arms=["random", "heuristic"])
    assert len(log.read_text().splitlines()) == 4  # everything there: nothing runs again


@pytest.mark.browser
@pytest.mark.slow
def test_export_and_report_of_a_partial_experiment(policy_arms, tmp_path):
    import pyarrow.parquet as pq

    from bench.learning_export import export
    from bench.reports.learning_v1 import report

    results = tmp_path / "results"
    assert export(policy_arms, results).startswith("8 evaluation episodes")
    rows = pq.read_table(results / "episodes.parquet").to_pylist()
    assert {(r["arm"], r["split"]) for r in rows} == {(a, s) for a in ("random", "heuristic") for s in ("test_seeds", "heldout_tasks")}
    assert {r["task_seed"] for r in rows} == {200100, 200101}
    assert all(r["training_seed"] == 0 and r["env_steps"] == 0 and 1 <= r["n_steps"] <= 3 for r in rows)
    assert all(r["success"] for r in rows if r["arm"] == "heuristic")  # click-button and click-test name what to click

    text = report(results)
    assert "**PARTIAL**" in text  # zero_shot and the trained arms are missing
    assert "| heuristic | 1 | 2 | 100.0" in text
    assert "`python -m bench learning run` --arms random" in text


@pytest.mark.browser
@pytest.mark.slow
def test_the_dashboard_shows_the_experiments_cells(policy_arms, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("HALO_LAKE", str(policy_arms.lake))
    at = AppTest.from_file(str(REPO / "dashboards" / "app.py"), default_timeout=60)
    at.run()
    at.switch_page("app_pages/experiments.py").run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value
    assert set(table.arm) == {"random", "heuristic"} and set(table.split) == {"test_seeds", "heldout_tasks"}
    assert (table[table.arm == "heuristic"]["pooled %"] == 100.0).all()
    assert (table["attempts"] == 2).all()  # a cell's tasks summed: 2 test seeds of one task per split
    by_task = at.dataframe[1].value
    assert set(by_task.task_id) == {"miniwob.click-button", "miniwob.click-test"}
    assert (by_task["heuristic s0"] == 100.0).all() and {"random s0", "heuristic s0"} <= set(by_task.columns)


def test_the_online_arms_learning_signal_is_reported_by_iteration():
    """The evidence where a curve does not rise: each iteration's sampled success, reward spread, flat groups,
    loss, clipping and held-out point, from the online run's train_metrics (as the export keeps them)."""
    from bench.reports.learning_v1 import signal_table

    timing = {"online_iterations": {"s0": [
        {"iteration": 0, "update": "trained", "signal": {"success_rate/train": 0.25, "rewards/mean": 0.1, "rewards/std": 0.5,
                                                          "frac_reward_zero_std": 1 / 6, "trainable_groups": 5, "loss": -0.002,
                                                          "clip_ratio": 0.04}},
        {"iteration": 1, "update": "skipped: every group has zero reward spread",
         "signal": {"success_rate/train": 0.0, "frac_reward_zero_std": 1.0, "trainable_groups": 0, "success_rate/heldout": 0.5}},
    ]}}
    rows = signal_table(timing).splitlines()[2:]
    assert rows == ["| s0 | 0 | 25 | 0.100 ± 0.500 | 17 | 5 | -0.0020 | 0.040 | – | trained |",
                    "| s0 | 1 | 0 | – ± – | 100 | 0 | – | – | 50 | skipped: every group has zero reward spread |"]
    assert signal_table({"online_iterations": {"s0": [{"iteration": 0, "update": "trained"}]}}) == ""  # an older export
    # Exports name every online run ARM-sN; older ones named online_grpo's sN: both read alike.
    assert signal_table({"online_iterations": {"online_grpo-s0": timing["online_iterations"]["s0"]}}).splitlines()[2:] == rows
    gigpo = signal_table({"online_iterations": {"online_gigpo-s1": timing["online_iterations"]["s0"][:1]}})
    assert gigpo.splitlines()[2].startswith("| online_gigpo s1 | 0 | 25 |")


def test_an_online_curve_points_per_seed_runs_are_timed_as_one_row_and_a_resumed_iteration_is_marked():
    from bench.reports.learning_v1 import timing_table

    timing = {"eval_runs": [
        {"run_id": "lv1-eval-dpo-s0-dev", "steps": 10, "policy_seconds_per_step": 0.5, "wall_seconds_per_step": 1.0},
        {"run_id": "lv1-online_grpo-s0-eval-v2-s160000", "steps": 3, "policy_seconds_per_step": 1.0, "wall_seconds_per_step": 2.0},
        {"run_id": "lv1-online_grpo-s0-eval-v2-s160001", "steps": 1, "policy_seconds_per_step": 5.0, "wall_seconds_per_step": 6.0},
        {"run_id": "lv1-online_grpo-s0-eval-v4-s160000", "steps": 0, "policy_seconds_per_step": None, "wall_seconds_per_step": None},
    ], "online_iterations": {"s0": [
        {"iteration": 0, "iteration_seconds": 90.0, "rollout_seconds": 50.0, "update_seconds": 35.0, "reload_seconds": 0.4,
         "update": "trained"},
        {"iteration": 1, "iteration_seconds": 500.0, "rollout_seconds": 700.0, "update_seconds": 70.0, "reload_seconds": 0.2,
         "update": "trained"},
    ]}}
    lines = timing_table(timing).splitlines()
    assert lines[2:4] == ["| lv1-eval-dpo-s0-dev | 10 | 0.50 | 1.00 |",
                          "| lv1-online_grpo-s0-eval-v2 (2 runs) | 4 | 2.00 | 3.00 |"]  # weighted by steps
    assert lines[4] == ("- online_grpo s0 iteration 0: 90 s: rollout 50 s, update 35 s, reload 0.4 s, the rest "
                        "(held-out curve, bookkeeping) 5 s (trained)")
    assert lines[5].startswith("- online_grpo s0 iteration 1: interrupted and resumed: 500 s after the resume; rollout 700 s")


def test_the_evidence_is_what_each_job_read_its_metrics_at_both_ends_and_the_test_states_seen_in_training(tmp_path):
    """The export keeps each sample's successes per task; each bc/dpo job's rows as the job recorded them when it
    saved (not a recount of the view) with its train_metrics averaged over the first and the last logged steps; and
    which of zero_shot's test pages a training run had."""
    import datetime as dt
    import json

    from bench.learning_export import SIGNAL_WINDOW, evidence
    from bench.reports.learning_v1 import novelty_table, offline_table, repeating_tasks, sample_table, without_tasks_table
    from halo_data.synthetic import SyntheticSpec, build_synthetic_lake
    from halo_data.writer import append_rows

    runner = Runner(load(small_protocol(tmp_path)), tmp_path / "root")
    lake = build_synthetic_lake(str(runner.lake), SyntheticSpec(n_steps=120, attempts_per_task=4, min_steps=2, max_steps=4,
                                                                screenshots=False, run_id=runner.p.sample_run(0)))
    out = runner.adapter_dir("dpo", 0)
    (out / "final").mkdir(parents=True)
    (out / "final" / "training_stats.json").write_text(json.dumps({"rows": 87, "epoch": 1.6}))
    now = dt.datetime.now(dt.timezone.utc)
    lake.upsert_runs([{"run_id": "train-dpo-1", "kind": "train", "job_type": "dpo", "output_dir": str(out.resolve()),
                       "source_view": f"dpo_pairs WHERE run_id = '{runner.p.sample_run(0)}'", "started_at": now,
                       "ended_at": now + dt.timedelta(seconds=60)}])
    steps = range(1, 2 * SIGNAL_WINDOW + 2)
    append_rows(lake, "train_metrics", [{"run_id": "train-dpo-1", "step": s, "epoch": None, "metric": m, "value": v(s),
                                         "logged_at": now} for s in steps
                                        for m, v in (("loss", lambda s: 0.7 - 0.01 * s), ("rewards/margins", float))])
    # zero_shot's test seeds: one episode starts on a page the sample had, then leaves it; another starts anew.
    [trained] = lake.query_arrow("select prompt_hash from steps where step_idx = 0 limit 1").to_pylist()
    test_run = next(c.run_id for c in runner.p.eval_cells("zero_shot", 0) if c.split == "test_seeds")
    page = json.dumps([{"role": "system", "content": "[1] button 'not the page'"},
                       {"role": "user", "content": "URL: x\nPage:\n[5] image '' (trash)\n[6] button 'OK'\nGoal: y"}])
    append_rows(lake, "steps", [{"run_id": test_run, "episode_id": e, "task_id": "miniwob.click-button", "step_idx": i,
                                 "prompt_hash": h, "prompt": prompt}
                                for e, i, h, prompt in (("t1", 0, trained["prompt_hash"], None), ("t1", 1, "new-1", page),
                                                        ("t2", 0, "new-2", page.replace("'OK'", "''")))])

    t = evidence(runner)
    episodes = lake.query_arrow("select task_id, count(*) n, sum(success::int) s from episodes "
                                f"where run_id = '{runner.p.sample_run(0)}' group by task_id").to_pylist()
    assert t["samples"] == {"s0": {e["task_id"]: {"episodes": e["n"], "successes": e["s"]} for e in episodes}}
    [job] = t["offline_jobs"]
    assert (job["arm"], job["training_seed"], job["rows"], job["epochs"], job["logged_steps"]) == ("dpo", 0, 87, 1.6, len(steps))
    assert job["first"]["rewards/margins"] == pytest.approx(sum(range(1, SIGNAL_WINDOW + 1)) / SIGNAL_WINDOW)
    assert job["last"]["loss"] == pytest.approx(0.7 - 0.01 * (steps[-1] + steps[-SIGNAL_WINDOW]) / 2)
    assert "mean_token_accuracy" not in job["first"]  # a bc metric: not a dpo job's
    assert t["state_novelty"] == {"test_seeds": {"miniwob.click-button": {
        "episodes": 2, "distinct_first_pages": 2, "first_state_seen": 1, "steps": 3, "steps_seen": 1}}}
    # The page its prompts showed: the user message's Page section, not the system prompt; a step without a prompt
    # is not counted.
    assert t["observation_names"] == {"test_seeds": {"miniwob.click-button": {
        "steps": 2, "elements": 4, "unnamed": 3, "steps_with_no_name": 1}}}

    row = offline_table(t).splitlines()[2]
    assert row.startswith("| dpo | s0 | 87 pairs | 1.6 | 0.675 → 0.625 |") and "| – |" in row  # no token accuracy for dpo
    total = sum(e["s"] for e in episodes), sum(e["n"] for e in episodes)
    assert sample_table(t).splitlines()[-1] == f"| all | {total[0]} of {total[1]} |"
    assert novelty_table(t).splitlines()[2] == "| test_seeds | click-button | 2 of 2 | 1 of 2 | 1 of 3 |"
    assert repeating_tasks(t) == ["miniwob.click-button"]  # half its test seeds start on a training page
    assert offline_table({}) == sample_table({}) == novelty_table({}) == ""  # an older export
    results = [{"arm": "zero_shot", "split": "test_seeds", "task_id": task, "success": ok}
               for task, ok in (("miniwob.click-button", True), ("miniwob.click-option", True), ("miniwob.click-option", False))]
    assert without_tasks_table(results, "test_seeds", repeating_tasks(t)).splitlines()[2] == "| zero_shot | 2 | 50.0 [9.5, 90.5] |"


def test_each_registered_target_is_decided_by_its_pooled_difference_and_interval():
    from bench.reports.learning_v1 import targets_table

    def episodes(arm, split, successes, attempts):
        return [{"arm": arm, "training_seed": 0, "split": split, "task_id": "miniwob.t", "version": None,
                 "success": i < successes} for i in range(attempts)]

    rows = (episodes("zero_shot", "test_seeds", 20, 100) + episodes("bc_filtered", "test_seeds", 70, 100)
            + episodes("dpo", "test_seeds", 30, 100) + episodes("online_grpo", "test_seeds", 68, 100)
            + episodes("zero_shot", "heldout_tasks", 50, 100) + episodes("dpo", "heldout_tasks", 52, 100))
    lines = targets_table(rows).splitlines()[2:]
    assert lines[0].startswith("| test_seeds: best trained arm ≥ zero_shot + 20 points | bc_filtered: +50.0 [")
    assert lines[0].endswith("| met, its whole interval too |")
    assert lines[1].endswith("| dpo: +2.0 [-11.6, +15.5] | not met by the estimate; the interval reaches it |")
    assert lines[2].startswith("| test_seeds: online_grpo ≥ bc_filtered at equal environment steps | online_grpo − bc_filtered: -2.0")
    assert len(lines) == 3  # no online_grpo on the held-out tasks: no comparison there
    assert targets_table(episodes("random", "test_seeds", 1, 2)) == ""

    from bench.reports.learning_v1 import seed_task_table

    second = [{**r, "training_seed": 1, "success": False} for r in episodes("bc_filtered", "test_seeds", 0, 4)]
    assert seed_task_table(rows + second).splitlines() == [
        "| task | bc_filtered s0 | bc_filtered s1 | dpo s0 | online_grpo s0 |", "| --- | --- | --- | --- | --- |",
        "| t | 70 | 0 | 30 | 68 |"]  # trained arms only, a column per training seed
