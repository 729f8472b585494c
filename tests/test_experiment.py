"""halo-train experiment: a tiny protocol run for real (random policy, Chromium, a real lake) under its records —
registration at a commit, refusal at another until registered again, each test cell evaluated once, resumed from
the lake alone; the statistics of the report; learning-v2's registered protocol and its screening."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from halo_train.experiment import ExperimentError, Protocol, ProtocolError, Records, Runner, load
from halo_train.experiment.report import paired_bootstrap
from halo_train.experiment.screen import DEFAULT_RULES, verdict

REPO = Path(__file__).resolve().parent.parent


def tiny_protocol(path: Path, **changes) -> Path:
    raw = {
        "name": "tiny-exp", "version": 1, "base_model": "smollm2-135m-instruct",
        "interface": {"env": "miniwob", "observation": "elements", "constrain_actions": True, "temperature": 1.0,
                      "max_steps": 2, "reward_config": "halo_agent/configs/rewards-success.yaml"},
        "tasks": {"train": ["click-button"], "heldout": ["click-test"]},
        "splits": {"train": {"seed_stride": 100}, "dev": {"first": 1000},
                   "test": {"first": 2000, "train_tasks_seeds": 2, "heldout_tasks_seeds": 0}},
        "arms": {"random": {"kind": "policy", "policy": "random", "options": {"constrain_actions": True}}},
        "training_seeds": [0], "budget": {},
    }
    raw.update(changes)
    path.write_text(yaml.safe_dump(raw))
    return path


def git_repo(path: Path) -> Path:
    """A code checkout of its own, so the test decides when its commit moves."""
    path.mkdir(parents=True, exist_ok=True)
    for args in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", "-C", str(path), *args], check=True)
    commit(path, "one")
    return path


def commit(repo: Path, text: str) -> str:
    (repo / "code.py").write_text(text)
    subprocess.run(["git", "-C", str(repo), "add", "code.py"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", text], check=True)
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def test_a_stage_runs_only_once_registered_and_only_at_the_registered_commit(tmp_path):
    code = git_repo(tmp_path / "code")
    p = load(tiny_protocol(tmp_path / "tiny.yaml"))
    runner = Runner(p, tmp_path / "root", code_dir=code)
    with pytest.raises(ExperimentError, match="not registered"):
        runner.run()
    first = runner.records.register(p)
    assert first["commit"] and first["protocol_sha256"] == p.sha256 and first["packages"]["duckdb"]
    assert runner.records.check(p)["commit"] == first["commit"]
    moved = commit(code, "two")
    with pytest.raises(ExperimentError, match="registered again"):
        runner.run()
    again = runner.records.register(p)  # re-registration: the same file at the new commit
    assert again["commit"] == moved and len(runner.records.registrations()) == 2
    assert runner.records.check(p)["commit"] == moved
    edited = load(tiny_protocol(tmp_path / "tiny.yaml", training_seeds=[0, 1]))
    with pytest.raises(ExperimentError, match="not the file registered"):
        runner.records.check(edited)
    runner.records.append({"stage": "x", "event": "start"})  # once a stage ran, the file may not change
    with pytest.raises(ExperimentError, match="new protocol"):
        runner.records.register(edited)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The tiny protocol's random arm, registered and run into a real lake: its one test cell (no held-out seeds), its
    command killed as soon as it has started its run (a stage stopped part-way), then the runner."""
    import signal
    import time

    tmp = tmp_path_factory.mktemp("experiment")
    code = git_repo(tmp / "code")
    p = load(tiny_protocol(tmp / "tiny.yaml"))
    runner = Runner(p, tmp / "root", code_dir=code)
    runner.records.register(p)
    cell = p.eval_cells("random", 0)[0]
    child = subprocess.Popen(runner.rollout_argv(cell.run_id, cell.tasks, cell.first_seed, cell.seeds, cell.attempts, 0,
                                                 runner.policy_arm("random")), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not runner.state.has_run(cell.run_id) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=60)
    interrupted = runner.state.episodes(cell.run_id)
    runner.run()
    return runner, interrupted


@pytest.mark.browser
@pytest.mark.slow
def test_the_runner_resumes_from_the_lake_and_records_each_stage_with_its_commit(ran):
    runner, interrupted = ran
    p = runner.p
    assert interrupted < p.eval_cells("random", 0)[0].episodes  # the stage was stopped before it was done
    commands = (runner.root / "commands.log").read_text().splitlines()
    assert len(commands) == 1 and "--resume" in commands[0]
    for cell in p.eval_cells("random", 0):
        seeds = runner.state.query("select task_seed, count(*) n from episodes where run_id = $r group by 1 order by 1",
                                   {"r": cell.run_id})
        assert [(s["task_seed"], s["n"]) for s in seeds] == [(2000 + i, 1) for i in range(cell.seeds)]  # each once
    starts = [s for s in runner.records.stages() if s["event"] == "start"]
    head = runner.records.current()["commit"]
    assert [s["run_id"] for s in starts if s.get("test")] == [p.eval_cells("random", 0)[0].run_id]
    assert all(s["commit"] == head and s["packages"]["duckdb"] and s["policy"] == "random" for s in starts if s.get("test"))
    # what its seconds depend on besides the code: the cores, the load, the OpenMP settings its processes inherit
    assert all(s["machine"]["cores"] >= 1 and s["machine"]["load_average"] >= 0
               and s["machine"]["openmp"]["OMP_WAIT_POLICY"] == os.environ["OMP_WAIT_POLICY"] for s in starts)
    assert [s["rc"] for s in runner.records.stages() if s["event"] == "end"] == [0]
    Runner(p, runner.root, code_dir=runner.records.code_dir).run()  # a new process knows only the lake: nothing runs
    assert len((runner.root / "commands.log").read_text().splitlines()) == 1


@pytest.mark.browser
@pytest.mark.slow
def test_the_export_carries_each_stages_commit_and_the_report_recomputes_from_it(ran, tmp_path):
    import pyarrow.parquet as pq

    from halo_train.experiment.export import export
    from halo_train.experiment.report import report

    runner, _ = ran
    assert export(runner, tmp_path / "results").startswith("2 evaluation episodes")
    rows = pq.read_table(tmp_path / "results" / "episodes.parquet").to_pylist()
    assert {(r["arm"], r["split"], r["sampling_seed"], r["temperature"]) for r in rows} == {("random", "test_seeds", 0, 1.0)}
    firsts = runner.state.query("select task_seed, action from steps where run_id = $r and step_idx = 0 order by 1",
                                {"r": rows[0]["run_id"]})
    assert [(r["task_seed"], r["first_action"]) for r in rows] == [(f["task_seed"], f["action"]) for f in firsts]
    raws = runner.state.query("select task_seed, raw_reward from episodes where run_id = $r order by 1", {"r": rows[0]["run_id"]})
    assert [(r["task_seed"], r["raw_reward"]) for r in rows] == [(e["task_seed"], e["raw_reward"]) for e in raws]
    assert all((r["raw_reward"] > 0) == r["success"] for r in rows)  # a success is the raw reward above 0
    meta = json.loads((tmp_path / "results" / "meta.json").read_text())
    assert meta["stage_commits"] == [runner.records.current()["commit"]] and meta["registrations"][0]["protocol_sha256"]
    text = report(runner.p, tmp_path / "results")
    wins = sum(r["success"] for r in rows)
    assert f"| random | 1 | 2 | {100 * wins / 2:.1f} [" in text and runner.records.current()["commit"][:12] in text


@pytest.mark.browser
@pytest.mark.slow
def test_test_seeds_are_never_evaluated_twice(ran, tmp_path):
    import shutil

    ran, _ = ran
    root = tmp_path / "copy"
    shutil.copytree(ran.root, root)
    runner = Runner(ran.p, root, code_dir=ran.records.code_dir)
    shutil.rmtree(root / "lake")  # the episodes are gone; the records say the test seeds were evaluated
    with pytest.raises(ExperimentError, match="a second evaluation is refused"):
        runner.run()
    assert not (root / "lake").exists()
    cell = ran.p.eval_cells("random", 0)[0]
    with pytest.raises(ExperimentError, match="again with"):
        runner.records.check_test_once(cell.run_id, "smollm2-135m-instruct+bc-s0/final@0123", 1)


def _tree(folder: Path) -> dict[str, bytes]:
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.mark.browser
@pytest.mark.slow
def test_a_pack_keeps_what_run_needs_and_unpacks_into_a_root_that_goes_on_from_it(ran, tmp_path, monkeypatch):
    """The root of a run experiment, with adapters as training leaves them, packed twice (the second time a mirror of
    the first) and unpacked elsewhere: the runner there has nothing left to do, the lake reads the same episodes."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from halo_train.experiment import pack as packing

    ran, _ = ran
    root = tmp_path / "root"
    shutil.copytree(ran.root, root)
    runner = Runner(ran.p, root, code_dir=ran.records.code_dir)
    a = root / "adapters"
    files = {"dpo-s0/checkpoint-4/optimizer.pt": b"o", "dpo-s0/final/adapter_config.json": b"{}",
             "bc-s0/round-0/checkpoint-4/optimizer.pt": b"4", "bc-s0/round-0/checkpoint-8/optimizer.pt": b"8",
             "online-s0/online_run.json": b"{}", "online-s0/policy-1/learner_state.pt": b"1",
             "online-s0/policy-2/learner_state.pt": b"2", "online-s0/.policy-3.saving/learner_state.pt": b"3"}
    for rel, data in files.items():
        (a / rel).parent.mkdir(parents=True, exist_ok=True)
        (a / rel).write_bytes(data)
    weights = {"base_model.model.q_proj.lora_A.weight": torch.randn(4, 8)}
    save_file(weights, str(a / "dpo-s0/final/adapter_model.safetensors"))
    (root / "run.pid").write_text("1")
    from deltalake import DeltaTable

    steps = DeltaTable(str(root / "lake/steps"))
    steps.create_checkpoint()  # the log's last checkpoint; one of an earlier version beside it is superseded
    last = root / f"lake/steps/_delta_log/{steps.version():020d}.checkpoint.parquet"
    shutil.copy(last, root / "lake/steps/_delta_log/00000000000000000000.checkpoint.parquet")
    plan = packing.Plan(runner)
    plan.finished, plan.last_served = {"dpo-s0"}, {"online-s0": 2}  # dpo's cells complete; online served version 2

    dest = tmp_path / "pack"
    manifest = packing.pack(runner, dest, plan)
    kept = _tree(dest)
    assert {rel for rel in kept if rel.startswith("adapters/")} == {
        "adapters/dpo-s0/final/adapter_config.json", "adapters/dpo-s0/final/adapter_model.safetensors",
        "adapters/bc-s0/round-0/checkpoint-8/optimizer.pt", "adapters/online-s0/online_run.json",
        "adapters/online-s0/policy-2/learner_state.pt"}
    half = load_file(str(dest / "adapters/dpo-s0/final/adapter_model.safetensors"))
    (name, tensor), = half.items()
    assert tensor.dtype == torch.float16 and torch.allclose(tensor.float(), weights[name], atol=1e-3)
    source = _tree(root)
    shots = [rel for rel in source if rel.startswith("lake/screenshots/") and "_delta_log" not in rel]
    assert shots and not any(rel in kept for rel in shots)
    stale = "lake/steps/_delta_log/00000000000000000000.checkpoint.parquet"
    assert {rel for rel in source if rel.startswith("lake/")} - set(kept) == {*shots, stale}
    assert all(kept[rel] == data for rel, data in source.items() if rel.startswith("lake/") and rel in kept)
    assert "run.pid" not in kept and manifest["omitted"]["screenshots (no stage reads them)"]["files"] == len(shots)
    assert last.relative_to(root).as_posix() in kept
    assert manifest["float16"] == ["adapters/dpo-s0/final/adapter_model.safetensors"]
    assert manifest["change"] == {"since": None, "written": {"files": len(kept) - 1, "bytes": manifest["bytes"]},
                                  "replaced": {"files": 0, "bytes": 0}, "removed": {"files": 0, "bytes": 0}}
    assert manifest["bytes"] == sum(len(data) for rel, data in kept.items() if rel != "pack.json")
    assert manifest["optimizer_states_kept"] == {"adapters/online-s0/policy-2/learner_state.pt": 1}

    # Packed again after the job moved on: its older checkpoint goes, unchanged files are not written again; a dry
    # run says so first and writes nothing.
    shutil.rmtree(a / "bc-s0/round-0/checkpoint-4")
    (a / "bc-s0/round-0/checkpoint-12").mkdir()
    (a / "bc-s0/round-0/checkpoint-12/optimizer.pt").write_bytes(b"12")
    steps_log = next((dest / "lake/steps/_delta_log").glob("*.json"))
    written = steps_log.stat().st_mtime_ns
    moved_on = {"since": manifest["packed_at"], "written": {"files": 1, "bytes": 2}, "replaced": {"files": 0, "bytes": 0},
                "removed": {"files": 1, "bytes": 1}}
    assert packing.pack(runner, dest, plan, dry_run=True)["change"] == moved_on
    assert _tree(dest) == kept
    assert packing.pack(runner, dest, plan)["change"] == moved_on
    assert "adapters/bc-s0/round-0/checkpoint-8/optimizer.pt" not in _tree(dest)
    assert (dest / "adapters/bc-s0/round-0/checkpoint-12/optimizer.pt").read_bytes() == b"12"
    assert steps_log.stat().st_mtime_ns == written
    for f in dest.rglob("*"):  # a checkout of the pack gives its files new times: compared by content, none differs
        os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert packing.pack(runner, dest, plan)["change"]["written"] == {"files": 0, "bytes": 0}
    (a / "bc-s0/round-0/checkpoint-12/optimizer.pt").write_bytes(b"twelve")  # a file written over
    assert packing.pack(runner, dest, plan)["change"]["replaced"] == {"files": 1, "bytes": 2}

    again = tmp_path / "again"
    done = packing.unpack(dest, again)
    assert done["repaired"] == {"screenshots": len(shots)}
    moved = Runner(ran.p, again, code_dir=ran.records.code_dir)
    episodes = "select episode_id, success from episodes order by episode_id"
    assert moved.state.query(episodes) == runner.state.query(episodes) != []
    assert moved.state.query("select count(*) n from screenshots") == [{"n": 0}]
    commands = (again / "commands.log").read_text()
    moved.run()  # every stage is done in the unpacked root too: nothing runs
    assert (again / "commands.log").read_text() == commands

    with pytest.raises(packing.PackError, match="not empty"):
        packing.unpack(dest, again)
    from halo_train.cli import main

    cli = CliRunner()
    out = cli.invoke(main, ["experiment", "unpack", str(ran.p.path), "--root", str(tmp_path / "x"), "--from", str(root)])
    assert out.exit_code == 1 and "is not a pack" in out.output and not (tmp_path / "x").exists()
    out = cli.invoke(main, ["experiment", "pack", str(ran.p.path), "--root", str(root), "--to", str(tmp_path / "p2")])
    assert out.exit_code == 0 and f"{len(shots)} screenshots" in out.output, out.output
    assert "0 of them over a file of 0.0 MiB in all), 0 removed (0.0 MiB) against an empty folder" in out.output
    assert "it holds 2 optimizer state(s) of arms still training (0.0 MiB)" in out.output  # online-s0's versions 1, 2
    out = cli.invoke(main, ["experiment", "pack", str(ran.p.path), "--root", str(root), "--to", str(tmp_path / "p2"),
                            "--dry-run"])
    assert out.exit_code == 0 and "0 files written (0.0 MiB; 0 of them over" in out.output and "against the pack of" in out.output
    copy2 = shutil.copy2

    def copy_while_a_writer_commits(src, dst):  # a stage still running appends to the lake while it is packed
        (root / "lake/steps/_delta_log/00000000000000000099.json").write_text("{}")
        return copy2(src, dst)

    monkeypatch.setattr(packing.shutil, "copy2", copy_while_a_writer_commits)
    with pytest.raises(packing.PackError, match="changed while it was packed"):
        packing.pack(runner, tmp_path / "other", plan)


def test_the_cli_registers_and_reports_status_and_refuses_bad_input(tmp_path, monkeypatch):
    from halo_train.cli import main

    code = git_repo(tmp_path / "code")
    monkeypatch.setenv("HALO_EXPERIMENT_CODE_DIR", str(code))
    proto = tiny_protocol(tmp_path / "tiny.yaml")
    cli = CliRunner()
    out = cli.invoke(main, ["experiment", "run", str(proto), "--root", str(tmp_path / "root")])
    assert out.exit_code == 1 and "Error: tiny-exp is not registered" in out.output
    assert not (tmp_path / "root").exists()  # a refused run leaves nothing behind
    out = cli.invoke(main, ["experiment", "register", str(proto), "--root", str(tmp_path / "root")])
    assert out.exit_code == 0 and "registered tiny-exp" in out.output, out.output
    out = cli.invoke(main, ["experiment", "status", str(proto), "--root", str(tmp_path / "root")])
    assert out.exit_code == 0 and "tev1-eval-random-s0-test_seeds" in out.output and "0/2" in out.output
    assert "registrations: 1" in out.output
    out = cli.invoke(main, ["experiment", "status", str(tmp_path / "missing.yaml")])
    assert out.exit_code == 1 and out.output.startswith("Error: no protocol at")
    bad = tiny_protocol(tmp_path / "bad.yaml", tasks={"train": ["click-button"], "heldout": ["click-button"]})
    out = cli.invoke(main, ["experiment", "register", str(bad), "--root", str(tmp_path / "r2")])
    assert out.exit_code == 1 and "held-out tasks are trained on" in out.output



def test_one_run_or_pack_holds_a_root_at_a_time_until_its_process_ends(tmp_path, monkeypatch):
    import sys

    from halo_train.cli import main
    from halo_train.experiment.record import holder

    code = git_repo(tmp_path / "code")
    monkeypatch.setenv("HALO_EXPERIMENT_CODE_DIR", str(code))
    proto, root = tiny_protocol(tmp_path / "tiny.yaml"), tmp_path / "root"
    cli = CliRunner()
    assert cli.invoke(main, ["experiment", "register", str(proto), "--root", str(root)]).exit_code == 0
    holding = ("import signal, sys, time; from halo_train.experiment.record import holding\n"
               "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as `experiment run` does\n"
               "with holding(sys.argv[1], 'run'):\n    print('held', flush=True); time.sleep(120)")
    stop = ["experiment", "stop", str(proto), "--root", str(root)]
    assert cli.invoke(main, stop).output == f"nothing holds {root}: nothing to stop\n"
    proc = subprocess.Popen([sys.executable, "-c", holding, str(root)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    out = cli.invoke(main, stop)
    assert out.exit_code == 0 and out.output.startswith(f"stopped `experiment run` (pid {proc.pid}, since "), out.output
    assert proc.wait(10) == 143 and holder(root) is None

    proc = subprocess.Popen([sys.executable, "-c", holding, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        assert holder(root)["pid"] == proc.pid
        for args in (["run"], ["pack", "--to", str(tmp_path / "pack")]):
            out = cli.invoke(main, ["experiment", *args, str(proto), "--root", str(root)])
            assert out.exit_code == 1 and out.output.startswith(
                f"Error: {root} is in use by `experiment run` (pid {proc.pid}, since "), out.output
        assert not (tmp_path / "pack").exists() and not (root / "lake").exists()  # nothing ran, nothing packed
        out = cli.invoke(main, ["experiment", "status", str(proto), "--root", str(root)])
        assert f"now: `experiment run` is running (pid {proc.pid}, since " in out.output
    finally:
        proc.kill()  # kill -9: the kernel lets go of the lock with the process
        proc.wait()
    assert holder(root) is None
    out = cli.invoke(main, ["experiment", "status", str(proto), "--root", str(root)])
    assert "now: no `experiment run` or `pack` holds this root" in out.output

def test_the_paired_interval_carries_both_seed_spread_and_task_seed_spread():
    units = [("t", i) for i in range(40)]
    steady = ([0, 1, 2], units, [[float(i % 2) for i in range(40)]] * 3)  # 50% on every seed
    spread = ([0, 1, 2], units, [[1.0] * 40, [0.0] * 40, [float(i % 2) for i in range(40)]])  # 100, 0, 50%
    d, lo, hi = paired_bootstrap(steady, steady)
    assert d == 0 and lo == pytest.approx(0) and hi == pytest.approx(0)  # the same arm: paired draws cancel
    d, lo, hi = paired_bootstrap(spread, steady)
    assert d == pytest.approx(0) and lo < -0.2 and hi > 0.2  # seed-to-seed spread widens the interval
    better = ([0], units, [[1.0] * 30 + [0.0] * 10])
    d, lo, hi = paired_bootstrap(better, ([0], units, [[float(i % 2) for i in range(40)]]))
    assert d == pytest.approx(0.25) and 0 < lo < 0.25 < hi


def test_the_report_shows_the_lakes_evidence_per_task_per_job_per_update_and_per_evaluated_state(tmp_path):
    """After the targets: success per task and arm, each training job's rows, passes and train_metrics at both ends
    (a round of expert iteration named by its arm, seed and round), each online run's signal over its iterations,
    and how many evaluated states training had seen."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from halo_train.experiment.report import report

    p = load(REPO / "bench" / "protocols" / "learning-v2.yaml")
    rows = [{"arm": arm, "training_seed": 0, "split": "test_seeds", "task_id": task, "task_seed": 250000 + i,
             "attempt": 0, "success": i < wins, "version": None, "temperature": 1.0, "run_id": f"lv2-eval-{arm}-s0-test_seeds",
             "first_action": "click('18')" if arm == "zero_shot" or i == 0 else f"click('{20 + i}')"}
            for arm, task, wins in (("zero_shot", "miniwob.choose-list", 1), ("bc_filtered", "miniwob.choose-list", 3),
                                    ("zero_shot", "miniwob.count-shape", 2), ("bc_filtered", "miniwob.count-shape", 0))
            for i in range(4)]
    rows[-1]["first_action"] = None  # an episode that took no step
    greedy = {**rows[4], "temperature": 0.0, "run_id": "lv2-eval-bc_filtered-s0-test_seeds-t0"}
    rows += [{**greedy, "task_seed": 250000 + i, "first_action": action}
             for i, action in enumerate(["click('9')", "click('9')", "click('18')"])]
    results = tmp_path / "results"
    results.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), results / "episodes.parquet")
    job = {"arm": "bc_filtered", "training_seed": 0, "round": 2, "job_type": "bc", "rows": 731, "epochs": 0.525,
           "logged_steps": 48, "window": 4, "first": {"loss": 1.195, "mean_token_accuracy": 0.67},
           "last": {"loss": 0.123, "mean_token_accuracy": 0.93}}
    evidence = {"samples": {"s0": {"miniwob.choose-list": {"episodes": 192, "successes": 62}}}, "offline_jobs": [job],
                "state_novelty": {"test_seeds": {"miniwob.click-collapsible": {
                    "episodes": 34, "distinct_first_pages": 27, "first_state_seen": 19, "steps": 100, "steps_seen": 55}}},
                "observation_names": {"test_seeds": {"miniwob.navigate-tree": {
                    "steps": 40, "elements": 196, "unnamed": 196, "steps_with_no_name": 40}}}}
    (results / "evidence.json").write_text(json.dumps(evidence))
    its = [{"iteration": k, "update": "trained", "signal": {"success_rate/train": s, "frac_reward_zero_std": z, "kl": 0.01}}
           for k, (s, z) in enumerate([(0.25, 0.5), (0.25, 0.5), (0.5, 0.25), (0.75, 0.25)])]
    learner = [{"iteration": k, "update": "trained", "signal": {"rows_produced": 100, "rows_trained": r, "approx_kl": kl,
                                                                "displacement_from_previous": d}}
               for k, (r, kl, d) in enumerate([(90, 0.002, 0.02), (60, 0.004, 0.01)])]
    (results / "timing.json").write_text(json.dumps({"online_iterations": {"online_grpo-s0": its, "online_gigpo-s0": [],
                                                                           "online_grpo-s1": learner}}))
    text = report(p, results)
    assert text.index("**Targets**") < text.index("**Per task: test_seeds, temperature 1**")
    assert "| choose-list | 1/4 (25%) | 3/4 (75%) |" in text and "| count-shape | 2/4 (50%) | 0/4 (0%) |" in text
    assert "| s0 | 62/192 |" in text
    assert "| bc_filtered | 0 | 2 | bc | 731 | 0.53 | 48 | 1.195 → 0.123 | 0.67 → 0.93 | – | – |" in text
    assert "| online_grpo-s0 | 4 | 4 | 0.25 → 0.625 | – | 0.5 → 0.25 | – | – | – | 0.01 → 0.01 | – | – | – |" in text
    # the persistent learner's records: rows produced and trained, its approx_kl as the KL, how far each update moved
    assert "| online_grpo-s1 | 2 | 2 | – | – | – | – | 100 → 100 | 90 → 60 | 0.002 → 0.004 | 0.02 → 0.01 | – | – |" in text
    assert "online_gigpo-s0" not in text  # no iterations yet: no row
    assert "| test_seeds | click-collapsible | 27/34 | 19/34 | 55/100 |" in text
    assert "| test_seeds | navigate-tree | 40 | 4.9 | 4.9 | 40/40 |" in text
    # how the first actions spread: zero_shot opens every page alike; each arm at its lowest temperature (bc's greedy)
    assert "**First actions: test_seeds**" in text and "First actions: heldout_tasks" not in text
    assert "| task | zero_shot (T=1) | bc_filtered (T=0) |" in text
    assert "| choose-list | 4/4 `click('18')` | 2/3 `click('9')` |" in text
    assert "| count-shape | 4/4 `click('18')` | – |" in text


def test_the_report_counts_which_successes_were_partial_credit():
    """MiniWoB's checkbox tasks score the share of boxes right, and a success is the raw reward above 0: the report
    shows, on the tasks where a success had a raw reward below 1, how many had every box right, and the success
    rates without those partial answers. An export without raw rewards (learning-v1's) shows no such table."""
    from halo_train.experiment.report import partial_credit_table

    p = load(REPO / "bench" / "protocols" / "learning-v2.yaml")
    episodes = [("zero_shot", "miniwob.click-checkboxes", [0.2, 1.0, -0.5, -1.0]),  # 2 successes, 1 with every box right
                ("online_grpo", "miniwob.click-checkboxes", [0.2, 0.5, 0.2, -0.2]),  # 3 successes, all partial
                ("zero_shot", "miniwob.choose-list", [1.0, -1.0, -1.0, -1.0]),
                ("online_grpo", "miniwob.choose-list", [1.0, 1.0, -1.0, -1.0])]
    rows = [{"arm": arm, "training_seed": 0, "split": "test_seeds", "task_id": task, "task_seed": 250000 + i, "attempt": 0,
             "success": raw > 0, "raw_reward": raw, "version": None, "temperature": 1.0}
            for arm, task, raws in episodes for i, raw in enumerate(raws)]
    text = partial_credit_table(p, rows, "test_seeds", 1.0)
    assert "| task | zero_shot | online_grpo |" in text
    assert "| click-checkboxes | 1/2/4 | 0/3/4 |" in text and "choose-list |" not in text
    # zero_shot: 3 of 8 successes, 2 without its one partial answer; online_grpo: 5 of 8, 2 without its 3
    assert text.endswith("| all tasks: success % without those partial answers (with them) | 25.0 (37.5) | 25.0 (62.5) |")
    assert partial_credit_table(p, [{**r, "raw_reward": None} for r in rows], "test_seeds", 1.0) == ""
    assert partial_credit_table(p, [r for r in rows if r["task_id"] == "miniwob.choose-list"], "test_seeds", 1.0) == ""


def test_the_report_sets_each_trained_arm_against_the_trained_arms_listed_before_it():
    """Learner against learner, paired by task seed on each split; an arm without episodes is left out."""
    from halo_train.experiment.report import trained_pairs_table

    p = load(REPO / "bench" / "protocols" / "learning-v2.yaml")
    wins = {"bc_filtered": 2, "online_grpo": 6, "online_gigpo": 6}
    rows = [{"arm": arm, "training_seed": 0, "split": "test_seeds", "task_id": "miniwob.choose-list",
             "task_seed": 250000 + i, "attempt": 0, "success": i < n, "version": None, "temperature": 1.0}
            for arm, n in wins.items() for i in range(10)]
    text = trained_pairs_table(p, rows)
    assert "| difference | test_seeds | heldout_tasks |" in text
    assert "| online_grpo − bc_filtered | +40.0 [" in text and "| online_gigpo − bc_filtered | +40.0 [" in text
    assert "| online_gigpo − online_grpo | +0.0 [+0.0, +0.0] | – |" in text  # the same episodes: paired draws cancel
    assert "dpo" not in text
    assert trained_pairs_table(p, [r for r in rows if r["arm"] == "bc_filtered"]) == ""


def test_the_report_reads_success_and_targets_again_without_tasks_whose_test_pages_training_had_seen():
    """A task whose evaluated first pages training had seen more often than the screening rule lets a dev page be
    seen (``max_pages_in_training``, 10%) is left out of a second reading of success and of the targets: what the arms
    do on new pages. A task at the limit stays in."""
    from halo_train.experiment.report import new_pages_sections, seen_tasks

    p = load(REPO / "bench" / "protocols" / "learning-v2.yaml")
    wins = {("zero_shot", "miniwob.click-collapsible"): 1, ("online_grpo", "miniwob.click-collapsible"): 10,
            ("zero_shot", "miniwob.choose-list"): 2, ("online_grpo", "miniwob.choose-list"): 3}
    rows = [{"arm": arm, "training_seed": 0, "split": "test_seeds", "task_id": task, "task_seed": 250000 + i,
             "attempt": 0, "success": i < n, "version": None, "temperature": 1.0}
            for (arm, task), n in wins.items() for i in range(10)]
    novelty = {"test_seeds": {"miniwob.click-collapsible": {"episodes": 10, "first_state_seen": 9},
                              "miniwob.choose-list": {"episodes": 10, "first_state_seen": 1}}}
    assert seen_tasks(p, {"state_novelty": novelty}) == {"test_seeds": ["miniwob.click-collapsible"]}
    table, targets = new_pages_sections(p, rows, {"state_novelty": novelty})
    assert table.startswith("**New pages only: test_seeds, temperature 1** (without click-collapsible,")
    # choose-list alone: 2 of 10 against 3 of 10 (with click-collapsible: 3 of 20 against 13 of 20)
    assert "| zero_shot | 1 | 10 | 20.0 [" in table and "| online_grpo | 1 | 10 | 30.0 [" in table
    assert "| online_grpo − zero_shot: +10.0 [" in targets
    novelty["test_seeds"]["miniwob.click-collapsible"]["first_state_seen"] = 1
    assert new_pages_sections(p, rows, {"state_novelty": novelty}) == []


def test_an_offline_job_is_named_by_its_arm_seed_and_round_and_one_stopped_before_its_first_step_is_left_out(tmp_path):
    from halo_train.experiment.export import offline_training

    class State:
        def query(self, sql, params=None, **_):
            return []

    class Runner_:
        p = load(REPO / "bench" / "protocols" / "learning-v2.yaml")
        state = State()

    out = tmp_path / "adapters" / "bc_filtered-s1" / "round-2" / "final"
    out.mkdir(parents=True)
    (out / "training_stats.json").write_text(json.dumps({"rows": 731, "epoch": 0.5}))
    jobs = [{"run_id": "train-bc-1", "job_type": "bc", "output_dir": str(out.parent), "source_view": "bc_rows"},
            {"run_id": "train-dpo-1", "job_type": "dpo", "output_dir": str(tmp_path / "adapters" / "dpo-s0"), "source_view": "dpo_pairs"}]
    got = [(j["arm"], j["training_seed"], j["round"], j["rows"]) for j in offline_training(Runner_(), jobs)["offline_jobs"]]
    assert got == [("bc_filtered", 1, 2, 731), ("dpo", 0, None, None)]

    class Logged(State):  # train-dpo-3 logged its steps; train-dpo-2, in the same folder, was stopped before its first
        def query(self, sql, params=None, **_):
            return [{"metric": "loss", "step": 1, "value": 0.69}] if params and params.get("r") == "train-dpo-3" else []

    Runner_.state = Logged()
    dpo = {"job_type": "dpo", "output_dir": str(tmp_path / "adapters" / "dpo-s0"), "source_view": "dpo_pairs"}
    got = offline_training(Runner_(), [{**dpo, "run_id": "train-dpo-2"}, {**dpo, "run_id": "train-dpo-3"}])["offline_jobs"]
    assert [(j["arm"], j["logged_steps"], j["first"]) for j in got] == [("dpo", 1, {"loss": 0.69})]


def test_the_screen_compares_dev_pages_with_every_train_seed_the_plan_uses_unless_told_a_number(tmp_path):
    from halo_train.experiment.screen import train_pages_seeds

    v2 = load(REPO / "bench" / "protocols" / "learning-v2.yaml")
    assert train_pages_seeds(v2) == list(range(16))  # its registered screen: 16 seeds of training seed 0
    raw = yaml.safe_load((REPO / "bench" / "protocols" / "learning-v2.yaml").read_text())
    raw["screening"].pop("train_pages")
    (tmp_path / "all.yaml").write_text(yaml.safe_dump(raw))
    plan = load(tmp_path / "all.yaml")
    seeds = train_pages_seeds(plan)
    # bc_filtered's 3 rounds of 16 seeds are the most any arm takes; three training seeds, 10000 apart
    assert plan.train_seeds_used == 48 and len(seeds) == 144
    assert seeds[:2] == [0, 1] and seeds[47:49] == [47, 10000] and seeds[-1] == 20047
    for bad in ("some", 0, True):
        raw["screening"]["train_pages"] = bad
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
        with pytest.raises(ProtocolError, match="screening.train_pages is"):
            load(tmp_path / "bad.yaml")


def test_screening_rules():
    row = {"first_pages": {"dev_seeds": 16, "share_distinct": 15 / 16, "dev_pages_in_training_sample": 0, "min_actions": 3},
           "zero_shot": {"rate": 0.25}, "random": {"rate": 0.1}}
    assert verdict(row, DEFAULT_RULES) == []
    one_page = {**row, "first_pages": {**row["first_pages"], "share_distinct": 1 / 16, "dev_pages_in_training_sample": 16}}
    assert [b.split(" ")[0] for b in verdict(one_page, DEFAULT_RULES)] == ["distinct", "100%"]
    assert verdict({"first_pages": row["first_pages"]}, DEFAULT_RULES) == ["not measured: random, zero-shot"]
    assert verdict({**row, "zero_shot": {"rate": 0.7}, "random": {"rate": 0.5}}, DEFAULT_RULES) == [
        "zero-shot 70% outside [5%, 60%]", "random 50% >= 50%"]


def test_learning_v2_is_registered_as_the_issue_asks_and_its_tasks_pass_their_screening():
    p = load("learning-v2")
    v1 = load("learning-v1")
    assert p.base_model == v1.base_model and p.interface == {**v1.interface, "prompt_version": p.interface["prompt_version"]}
    assert len(p.train_tasks) >= 6 and len(p.heldout_tasks) >= 4 and len(p.training_seeds) >= 3
    assert p.arm_seeds("zero_shot") == (0, 1, 2) and p.temperatures == (1.0, 0.0)
    assert set(p.trained_arms()) == {"bc_filtered", "dpo", "online_grpo", "online_gigpo"}
    budgets = {arm: p.arm_episodes(arm) for arm in p.trained_arms()}
    assert len(set(budgets.values())) == 1 and min(budgets.values()) >= 3 * v1.budget["episodes"]
    assert p.method("bc_filtered") == "expert_iteration" and p.rounds("bc_filtered") >= 2
    assert p.hyperparameters["online_grpo"]["omega"] == 0 and p.hyperparameters["online_gigpo"]["omega"] == 1
    screening = json.loads((REPO / "bench" / "results" / "learning-v2" / "screening.json").read_text())
    for task in p.tasks(p.train_tasks + p.heldout_tasks):
        row = screening["tasks"][task]
        assert row["breaks"] == [] and {"first_pages", "random", "heuristic", "zero_shot"} <= set(row), task
        assert row["zero_shot"]["episodes"] >= 10 and row["first_pages"]["dev_seeds"] >= 16
        assert row["zero_shot"]["episodes"] and row["first_pages"]["share_distinct"] >= 0.9
    assert all(s["commit"] for s in screening["stages"])


def test_learning_v2s_plan_trains_each_arm_before_any_evaluation_of_it(tmp_path):
    runner = Runner(load("learning-v2"), tmp_path / "root", dry_run=True)
    runner.run()
    commands = (tmp_path / "root" / "commands.log").read_text().splitlines()
    online = [c for c in commands if " online-grpo " in c]
    assert len(online) == 6 and sum("--omega 0 " in c for c in online) == 3 and sum("--omega 1 " in c for c in online) == 3
    assert all("--epochs-per-update" in c and "--mini-batch-size" in c for c in online)
    assert any("--run-id lv2-bc_filtered-s0-r0" in c for c in commands)  # expert iteration's first round: its sample,
    bc = [shlex.split(c.split(" ", 1)[1]) for c in commands if "halo-train bc " in c]  # then SFT on its successes
    assert [argv[argv.index("--where") + 1] for argv in bc][0] == "run_id IN ('lv2-bc_filtered-s0-r0') AND success"
    dpo = [shlex.split(c.split(" ", 1)[1]) for c in commands if "halo-train dpo" in c]
    assert [argv[argv.index("--where") + 1] for argv in dpo] == [f"run_id = 'lv2-sample-s{s}'" for s in (0, 1, 2)]
    for arm in ("bc_filtered", "dpo", "online_grpo", "online_gigpo"):
        assert not any(f"-eval-{arm}-" in c for c in commands)
    zero = [c for c in commands if "-eval-zero_shot-" in c]
    assert len(zero) == 3 * 2 + 2 + 1  # 3 sampling seeds x 2 splits at temperature 1, greedy once, the dev point
    assert sum("--temperature 0.0" in c for c in zero) == 2


def test_the_interfaces_env_options_reach_every_rollout_and_online_run(tmp_path):
    """interface.env_options (success: full) goes to each rollout as --env-option and to each online run as
    --env-options; learning-v2, which names none, runs the commands it was registered with."""
    raw = yaml.safe_load((REPO / "bench" / "protocols" / "learning-v2.yaml").read_text())
    raw["interface"]["env_options"] = {"success": "full"}
    (tmp_path / "strict.yaml").write_text(yaml.safe_dump(raw))
    Runner(load(tmp_path / "strict.yaml"), tmp_path / "root", dry_run=True).run()
    commands = (tmp_path / "root" / "commands.log").read_text().splitlines()
    rollouts = [c for c in commands if " rollout " in c]
    online = [c for c in commands if " online-grpo " in c]
    assert rollouts and all("--env-option success=full" in c for c in rollouts)
    assert online and all("--env-options success=full" in c for c in online)
    Runner(load("learning-v2"), tmp_path / "v2", dry_run=True).run()
    assert "env-option" not in (tmp_path / "v2" / "commands.log").read_text()
    raw["interface"]["env_options"] = ["success=full"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ProtocolError, match="interface.env_options is a mapping"):
        load(tmp_path / "bad.yaml")


def test_a_protocol_that_contradicts_itself_is_refused(tmp_path):
    with pytest.raises(ProtocolError, match="trained arm's method"):
        Protocol.load(tiny_protocol(tmp_path / "a.yaml", arms={"sft": {"kind": "trained"}}, hyperparameters={"sft": {}}))
    with pytest.raises(ProtocolError, match="hyperparameters.online"):
        Protocol.load(tiny_protocol(tmp_path / "b.yaml", arms={"online": {"kind": "trained", "method": "online"}}))
    raw = yaml.safe_load(tiny_protocol(tmp_path / "c.yaml").read_text())
    raw["screening"] = {"dev_first": 5, "candidates": ["click-button"]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ProtocolError, match="dev seeds only"):
        Protocol.load(tmp_path / "c.yaml")
    assert isinstance(Records(tmp_path / "none").current(), type(None))


@pytest.mark.browser
@pytest.mark.slow
def test_episodes_whose_environment_never_started_are_removed_and_run_again(ran, tmp_path):
    """An episode written by an older rollout whose environment failed before the policy acted (an env error, no
    model output, no action) tested no policy: run removes it, records that, and its test cell resumes with the
    same policy, so the seed is evaluated once for real."""
    import shutil

    from halo_data.lake import Lake
    from halo_data.writer import append_rows

    ran, _ = ran
    root = tmp_path / "copy"
    shutil.copytree(ran.root, root)
    runner = Runner(ran.p, root, code_dir=ran.records.code_dir)
    cell = ran.p.eval_cells("random", 0)[0]
    lake = Lake.open(str(root / "lake"))
    first = lake.query_arrow("select * from steps where run_id = $r order by task_seed, step_idx limit 1",
                             {"r": cell.run_id}, views=False, tables=("steps",)).to_pylist()[0]
    lake.table("steps").delete(predicate=f"episode_id = '{first['episode_id']}'")
    append_rows(lake, "steps", [{**first, "model_output": None, "action": None, "action_valid": False, "success": False,
                                 "error": "reset of miniwob.click-button failed: Playwright connection closed",
                                 "error_kind": "env", "n_steps": 0, "is_last": True}])
    assert runner.state.episodes(cell.run_id) == cell.episodes  # the cell looks complete
    runner.run()
    dropped = [s for s in runner.records.stages() if s["event"] == "dropped_unstarted"]
    assert [(s["run_id"], s["episode_ids"]) for s in dropped] == [(cell.run_id, [first["episode_id"]])]
    again = runner.state.query("select count(*) n, count(error) errors, bool_and(action is not null) acted from steps "
                               "where episode_id = $e", {"e": first["episode_id"]}, views=False, tables=("steps",))
    assert again[0]["errors"] == 0 and again[0]["acted"] and again[0]["n"] >= 1  # run again, by the policy
    assert runner.state.episodes(cell.run_id) == cell.episodes


def test_status_shows_an_online_runs_iterations_and_the_episodes_of_the_whole_plan(tmp_path):
    from halo_data.lake import Lake
    from halo_train.cli import main

    p = load("learning-v2")
    root = tmp_path / "root"
    its = int(p.hyperparameters["online_grpo"]["iterations"])
    lake = Lake.init(root / "lake")
    lake.upsert_runs([{"run_id": p.online_run(0, "online_grpo"), "kind": "online",
                       "config": json.dumps({"iterations": [{"iteration": i} for i in range(3)]})}])
    done = [{"iteration": i, "metrics": {"success_rate/train": 0.25 + i / 8, "rows_trained": 100 + i,
                                         "displacement_from_previous": 0.02, "iteration_seconds": 120 + 60 * i}}
            for i in range(2)]
    lake.upsert_runs([{"run_id": p.online_run(0, "online_gigpo"), "kind": "online",
                       "config": json.dumps({"iterations": done})}])
    rows = {r.stage: r for r in Runner(p, root, dry_run=True).status()}
    assert str(rows["train online_grpo s0"]) == f"3/{its} iterations" and (rows["train online_grpo s1"].there, rows["train online_grpo s1"].planned) == (0, its)
    assert str(rows["train online_gigpo s0"]) == (  # the last iteration, and the rest at 150 s each
        f"2/{its} iterations (last: sampled success 38%, 101 rows trained, moved 0.0200, about {(its - 2) * 150 // 60} min left)")
    assert str(rows["train bc_filtered s0"]) == "not done" and str(rows["lv2-sample-s0"]) == f"0/{p.sample_episodes}"
    for folder in ("dpo-s0/checkpoint-8", "dpo-s0/checkpoint-12", "bc_filtered-s1/round-0/final",
                   "bc_filtered-s1/round-1/checkpoint-4"):
        (root / "adapters" / folder).mkdir(parents=True)
    (root / "adapters/bc_filtered-s1/round-0/final/adapter_config.json").write_text("{}")
    rows = {r.stage: r for r in Runner(p, root, dry_run=True).status()}
    assert str(rows["train dpo s0"]) == "not done (checkpoint at step 12 of 64)"
    assert str(rows["train bc_filtered s1"]) == "not done (round 1: checkpoint at step 4 of 48)"
    out = CliRunner().invoke(main, ["experiment", "status", str(REPO / "bench" / "protocols" / "learning-v2.yaml"),
                                    "--root", str(root)])
    planned = sum(r.planned for r in rows.values() if r.unit == "episodes")
    assert out.exit_code == 0 and re.search(rf"^train online_grpo s0 +3/{its} iterations$", out.output, re.M), out.output
    assert f"episodes of the planned samples and evaluations: 0 of {planned} (0%); training: 0 of 12 done" in out.output
    assert "last stage" not in out.output  # nothing ran yet
    records = Runner(p, root, dry_run=True).records
    records.append({"stage": "online_grpo-s0", "event": "start", "at": "2026-11-29T12:43:17Z", "commit": "abc"})
    out = CliRunner().invoke(main, ["experiment", "status", str(REPO / "bench" / "protocols" / "learning-v2.yaml"),
                                    "--root", str(root)])
    assert "last stage: online_grpo-s0, started 2026-11-29T12:43:17Z; no end recorded: running, or stopped" in out.output
    records.append({"stage": "online_grpo-s0", "event": "end", "rc": 0, "at": "2026-11-29T13:40:00Z"})
    out = CliRunner().invoke(main, ["experiment", "status", str(REPO / "bench" / "protocols" / "learning-v2.yaml"),
                                    "--root", str(root)])
    assert "last stage: online_grpo-s0, ended 2026-11-29T13:40:00Z (exit 0)" in out.output
