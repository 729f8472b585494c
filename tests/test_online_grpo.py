"""halo-train online-grpo end to end on CPU: a tiny model served by HALO's chat server, MiniWoB++ in Chromium, the lake."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

from halo_train.testing import chat_server_in_process  # noqa: E402

TASKS = ["click-button", "click-test"]
REPO = Path(__file__).resolve().parent.parent
# A step's stored tokens and the distribution of their logprobs (what the trainer scores them under).
TOKEN_COLUMNS = "completion_token_ids, logprobs, logprobs_mode, draw, choices, temperature"


@pytest.fixture(scope="session")
def tiny(build_once) -> str:
    """A tiny model warmed up on random-policy steps, so its answers parse as actions and groups have spread."""
    from halo_train.testing import warm_tiny_model

    return build_once("warm-" + "-".join(TASKS), lambda root: warm_tiny_model(root, TASKS))  # test_online_state's too


def online_config(tiny: str, tmp_path: Path, **overrides):
    from halo_train.testing import small_online_config

    return small_online_config(tiny, tmp_path, **{"tasks": TASKS, **overrides})


def lora_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def query(lake: str, sql: str) -> list[dict]:
    from halo_data.lake import Lake

    return Lake.open(lake).query_arrow(sql).to_pylist()


@pytest.fixture(scope="module")
def killed_and_resumed(tiny, tmp_path_factory) -> dict:
    """One `halo-train online-grpo --serve --pipeline` run of three iterations (the chat server's runtime LoRA API,
    iteration k+1's rollout overlapping update k in the update process, a held-out eval after the third), killed
    with -9 once the first update saved its adapter (rollout 1 overlapping it is usually under way), then resumed
    to the end. The module's kill-and-resume run, pipelined because that resume has the most to get right: the
    record of iteration k names the version that sampled rollout k+1.

    Four task seeds per iteration (8 groups over the two tasks): an iteration whose groups are all flat trains
    nothing (and serves the version before), which a few groups of a sharpened tiny model can be (seen with 4
    groups); every update must train here."""
    root = tmp_path_factory.mktemp("online-killed")
    args = ["--base-model", tiny, "--serve", "--pipeline", "--tasks", ",".join(TASKS), "--iterations", "3",
            "--group-size", "4", "--seeds-per-iteration", "4", "--max-episode-steps", "2", "--train-steps", "1",
            "--lr", "0.01", "--lora-alpha", "16", "--max-tokens", "24", "--eval-every", "3", "--eval-seeds", "1",
            "--eval-attempts", "1", "--no-progress", "--lake", str(root / "lake"), "--output-dir", str(root / "out"),
            "--run-id", "online", "--env-options", "success=full"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Its own process group: the kill takes the command, its update process and the chat server it started, nothing else.
    with open(root / "killed.out", "w") as killed_out:
        proc = subprocess.Popen(_cli(*args), env=env, start_new_session=True, stdout=killed_out, stderr=subprocess.DEVNULL)
        first = root / "out" / "policy-1" / "adapter_model.safetensors"
        deadline = time.monotonic() + 180
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert first.exists(), "the first update never saved its adapter"
    saved = first.read_bytes()
    done = subprocess.run(_cli(*args, "--resume"), env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    # A line is printed once its iteration is recorded: the killed run's lines and the resumed run's are each once.
    lines = [line for out in ((root / "killed.out").read_text(), done.stdout) for line in out.splitlines()
             if line.startswith("iteration ")]
    return {"lake": str(root / "lake"), "out": root / "out", "saved": saved, "lines": lines, "stdout": done.stdout}


def test_three_pipelined_iterations_through_the_chat_servers_runtime_lora_api(killed_and_resumed):
    out, lake, lines = killed_and_resumed["out"], killed_and_resumed["lake"], killed_and_resumed["lines"]
    one, two = lora_weights(out / "policy-1"), lora_weights(out / "policy-2")
    assert one.keys() == two.keys()
    adapter = json.loads((out / "policy-1" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (16, 16)
    # Updates train without LoRA dropout (the online default), each warm-started from the version before.
    folders = ("policy-1", "policy-2", "policy-3")
    assert [json.loads((out / p / "adapter_config.json").read_text())["lora_dropout"] for p in folders] == [0.0] * 3
    assert any(not torch.equal(one[k], two[k]) for k in one), "the second update changed no adapter weight"
    # policy-2 continues policy-1 (one Adam step of lr 0.01 away), not a fresh LoRA drawn again.
    assert max(float((one[k] - two[k]).abs().max()) for k in one if "lora_A" in k) < 0.03
    # One line per iteration, no raw dicts.
    assert [line.split(":")[0] for line in lines] == ["iteration 0", "iteration 1", "iteration 2"]
    assert all("{" not in line for line in lines)
    assert all(f"-> policy-{k + 1}, reload" in line for k, line in enumerate(lines))
    # The last line names the version the run ended with and its folder (--serve: the engine stopped with the run).
    assert f"run online: 3 iterations; last served online-policy-3 ({(out / 'policy-3').resolve()})" in killed_and_resumed["stdout"]

    # Rows carry the version that sampled them: rollout 1 overlapped update 0 and was sampled by version 0, the one
    # still served (before the kill and after it); rollout 2 by version 1; the held-out eval after iteration 2 by policy-3.
    versions = query(lake, "select run_id, policy_version, any_value(adapter) adapter from episodes "
                           "group by all order by run_id")
    assert [(r["run_id"], r["policy_version"]) for r in versions] == [
        ("online-eval-v3-s100000", "3"), ("online-k0", "0"), ("online-k1", "0"), ("online-k2", "1")]
    eval_run = query(lake, "select adapter, kind from runs where run_id = 'online-eval-v3-s100000'")[0]
    assert eval_run == {"adapter": "online-policy-3", "kind": "eval"}
    # --env-options reached every rollout and eval (success=full: a success is every part of the answer right)
    configs = query(lake, "select config from runs where run_id like 'online-k%' or run_id like 'online-eval%'")
    assert [json.loads(c["config"])["env_options"] for c in configs] == [{"success": "full"}] * 4

    # One runs row with each iteration's lineage and adapter.
    run = query(lake, "select * from runs where run_id = 'online'")[0]
    assert (run["status"], run["job_type"], run["adapter"], run["policy_version"]) == ("finished", "online-grpo", "online-policy-3", "3")
    iterations = json.loads(run["config"])["iterations"]
    assert [Path(it["adapter"]).name for it in iterations] == ["policy-1", "policy-2", "policy-3"]
    assert [it["sampled_version"] for it in iterations] == [0, 0, 1]
    assert [it["next_rollout"]["version"] for it in iterations[:2]] == [0, 1]
    steps = [it["lineage"]["steps"] for it in iterations]
    assert steps[0] >= 1 and steps == sorted(set(steps))

    metrics = query(lake, "select step, metric from train_metrics where run_id = 'online'")
    by_step = {s: {m["metric"] for m in metrics if m["step"] == s} for s in (0, 1, 2)}
    expected = {"policy_version", "rewards/mean", "rewards/std", "success_rate/train", "frac_reward_zero_std",
                "trainable_groups", "reload_seconds", "rollout_steps_per_second", "update_seconds",
                "pipeline_overlap_seconds", "iteration_seconds",
                # what each update did (the persistent learner)
                "rows_produced", "rows_trained", "optimizer_steps", "groups_success_spread", "groups_shaping_spread_only",
                "anchor_groups_with_spread", "step_advantage_share", "displacement_from_base", "displacement_from_previous",
                "approx_kl", "entropy", "clip_ratio", "update_load_seconds", "update_train_seconds", "update_save_seconds"}
    assert all(expected - {"rollout_steps_per_second"} <= by_step[k] for k in (0, 1))
    assert expected | {"success_rate/heldout"} <= by_step[2]
    values = {(m["step"], m["metric"]): m["value"] for m in query(lake, "select step, metric, value from train_metrics where run_id = 'online'")}
    # Killed before iteration 0 was recorded, the resumed run finds its rollout whole in the lake: it samples nothing
    # and records no rollout speed (a 0 steps/s would read as a stalled rollout).
    resumed_first = [line for line in killed_and_resumed["stdout"].splitlines() if line.startswith("iteration 0:")]
    if resumed_first:
        assert "rollout already in the lake" in resumed_first[0] and "rollout_steps_per_second" not in by_step[0]
    else:
        assert values[0, "rollout_steps_per_second"] > 0
    assert values[2, "rollout_steps_per_second"] > 0  # rollout 2 sampled after the kill, every episode of it
    assert values[0, "pipeline_overlap_seconds"] >= 0 and values[2, "pipeline_overlap_seconds"] == 0  # the last has no rollout to overlap
    for k in (0, 1, 2):  # each update trained on every trainable row the iteration produced, and moved the adapter
        assert 0 < values[k, "rows_trained"] <= values[k, "rows_produced"]
        assert values[k, "displacement_from_previous"] > 0
    # Each version's folder holds the learner's state beside the adapter: the resumed run continued policy-1's optimizer.
    assert all((out / p / "learner_state.pt").exists() for p in folders)
    assert (out / "engine.log").exists()


@pytest.mark.parametrize("pipeline", [False, True], ids=["sequential", "pipelined"])
def test_a_refused_reload_keeps_the_served_version_and_the_data(tiny, tmp_path, monkeypatch, pipeline):
    from halo_agent.chat_server import ChatCompletionServer, RequestError
    from halo_agent.policies.hf_policy import LocalChatModel
    from halo_agent.serving import EngineClient
    from halo_train.online import run_online

    def refuse(self, body):  # as vLLM refuses an adapter it cannot serve (a retry cannot cure it: none is made)
        raise RequestError("rank 16 is greater than max_lora_rank 8", status=400, kind="BadRequestError")

    monkeypatch.setattr(ChatCompletionServer, "load_lora_adapter", refuse)
    with ChatCompletionServer(LocalChatModel(tiny, device="cpu"), served_model_name="tiny") as server:
        lines: list[str] = []
        # Two groups (see above); pipelined, the update of iteration 0 overlaps iteration 1's rollout.
        cfg = online_config(tiny, tmp_path, engine_url=server.url, seeds_per_iteration=2, pipeline=pipeline)
        summary = run_online(cfg, echo=lines.append)
        assert set(EngineClient(server.url).models()) == {"tiny"}  # no policy-* was ever loaded

    assert summary.served is None
    assert "still serving the base model" in lines[0] and "400 rank 16 is greater than max_lora_rank 8" in lines[0]
    # Both iterations' rows stay, and iteration 1 was sampled (and labelled) by version 0, the one still served.
    rows = query(cfg.lake, "select run_id, policy_version, count(*) n from episodes group by all order by run_id")
    assert [(r["run_id"], r["policy_version"], r["n"]) for r in rows] == [("online-k0", "0", 16), ("online-k1", "0", 16)]
    # The update went on from policy-1 (trained once, never served) on version 0's rows: one version stale.
    assert (Path(cfg.output_dir) / "policy-2" / "adapter_config.json").exists()
    iterations = json.loads(query(cfg.lake, "select config from runs where run_id = 'online'")[0]["config"])["iterations"]
    assert [it["served_after"]["name"] for it in iterations] == [None, None]


def test_learner_jobs_trains_each_update_as_a_grpo_job_and_reports_what_it_did(tiny, tmp_path):
    """`--learner jobs` (the job-per-update path `bench online-learner` compares with): each update a `halo-train grpo`
    job from the newest adapter, its version folder without learner state, its figures recorded as the learner's are.
    A second run on the same engine (the persistent learner) serves its versions under its own names: the first run's
    version stays loaded from its own folder."""
    from halo_agent.serving import EngineClient
    from halo_train.online import run_online

    with chat_server_in_process(tiny) as url:
        cfg = online_config(tiny, tmp_path, engine_url=url, iterations=1, seeds_per_iteration=2, learner="jobs", train_steps=2)
        summary = run_online(cfg, echo=lambda line: None)
        other = online_config(tiny, tmp_path / "other", engine_url=url, iterations=1, seeds_per_iteration=2, run_id="other",
                              lake=cfg.lake)
        second = run_online(other, echo=lambda line: None)
        loaded = {name: card.get("root") for name, card in EngineClient(url).models().items()}
    assert second.served == "other-policy-1"
    assert second.describe(url) == f"run other: 1 iteration; {url} serves other-policy-1 ({loaded['other-policy-1']})"
    assert loaded == {"tiny": loaded["tiny"], "online-policy-1": str((Path(cfg.output_dir) / "policy-1").resolve()),
                      "other-policy-1": str((Path(other.output_dir) / "policy-1").resolve())}
    out = Path(cfg.output_dir)
    assert summary.served == "online-policy-1" and (out / "policy-1" / "adapter_model.safetensors").exists()
    assert not (out / "policy-1" / "learner_state.pt").exists() and not (out / "updates" / "update-1").exists()
    stats = json.loads((out / "policy-1" / "training_stats.json").read_text())
    assert (stats["job_type"], stats["run_id"], stats["global_step"]) == ("grpo", "online-u1", 2)
    values = {m["metric"]: m["value"] for m in query(cfg.lake, "select metric, value from train_metrics where run_id = 'online' and step = 0")}
    assert values["optimizer_steps"] == 2 and 0 < values["rows_trained"] <= min(2 * cfg.batch_size, values["rows_produced"])
    assert values["displacement_from_previous"] == values["displacement_from_base"] > 0  # the first version: from the base
    assert values["update_seconds"] > 0 and values["update_cpu_seconds"] > 0


def test_held_out_evaluation_at_temperature_0_takes_each_steps_most_likely_action(tiny, tmp_path):
    from halo_agent.chat_server import ChatCompletionServer
    from halo_agent.policies.hf_policy import LocalChatModel
    from halo_agent.serving import EngineClient
    from halo_data.lake import Lake
    from halo_train.online import OnlineError, Served, evaluate

    with ChatCompletionServer(LocalChatModel(tiny, device="cpu"), served_model_name="tiny") as server:
        cfg = online_config(tiny, tmp_path, engine_url=server.url, eval_seeds=2, eval_attempts=3, eval_temperature=0.0)
        Lake.init(cfg.lake)
        rate = evaluate(cfg, EngineClient(server.url), "tiny", Served(None, 0), "online")
    episodes = query(cfg.lake, "select run_id, task_id, temperature, success from episodes")
    # Named after the temperature too, so a sampled evaluation of the same version is never resumed into it.
    assert {r["run_id"] for r in episodes} == {"online-eval-v0-t0-s100000", "online-eval-v0-t0-s100001"}
    assert len(episodes) == 2 * 3 * len(cfg.eval_tasks) and {r["temperature"] for r in episodes} == {0.0}
    assert rate == pytest.approx(sum(r["success"] for r in episodes) / len(episodes))
    # Greedy: every attempt at one page takes the same first action.
    first = query(cfg.lake, "select e.run_id, e.task_id, count(distinct s.model_output) n from steps s join episodes e "
                            "using (episode_id) where s.step_idx = 0 group by all")
    assert len(first) == 2 * len(cfg.eval_tasks) and {r["n"] for r in first} == {1}
    with pytest.raises(OnlineError, match="--eval-temperature must lie in 0..2"):
        online_config(tiny, tmp_path, engine_url=server.url, eval_temperature=-1.0)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "halo_train.cli", "online-grpo", *args]


def test_kill_9_then_resume_loses_nothing_and_trains_no_version_twice(killed_and_resumed):
    out, lake = killed_and_resumed["out"], killed_and_resumed["lake"]
    assert (out / "policy-1" / "adapter_model.safetensors").read_bytes() == killed_and_resumed["saved"]  # adopted, not trained again
    episodes = query(lake, "select run_id, count(*) n, count(distinct episode_id) d from episodes "
                           "where run_id like 'online-k%' group by run_id order by run_id")
    assert [(r["run_id"], r["n"], r["d"]) for r in episodes] == [(f"online-k{k}", 32, 32) for k in range(3)]
    steps = query(lake, "select count(*) n, count(distinct (episode_id, step_idx)) d from steps")[0]
    assert steps["n"] == steps["d"]
    run = query(lake, "select status, config from runs where run_id = 'online'")[0]
    assert run["status"] == "finished"
    iterations = json.loads(run["config"])["iterations"]
    assert [it["iteration"] for it in iterations] == [0, 1, 2]
    # Each version trained once: one loss row per optimizer step of each update run.
    assert [it["update"] for it in iterations] == ["trained"] * 3
    losses = query(lake, "select run_id, count(*) n from train_metrics where metric = 'loss' and run_id like 'online-u%' "
                         "group by run_id order by run_id")
    assert [(r["run_id"], r["n"]) for r in losses] == [("online-u1", 1), ("online-u2", 1), ("online-u3", 1)]
    # Each iteration's figures once, though iteration 0's were written by neither run alone.
    metric_rows = query(lake, "select step, metric, count(*) n from train_metrics where run_id = 'online' group by all")
    assert {r["step"] for r in metric_rows} == {0, 1, 2} and all(r["n"] == 1 for r in metric_rows)
    # Each update groups its own run's attempts only (another run's versions are named '0', '1', ... too).
    updates = query(lake, "select config from runs where run_id like 'online-u%'")
    assert [json.loads(u["config"])["params"]["group_scope"] for u in updates] == ["run"] * 3
    assert "iteration 2:" in killed_and_resumed["stdout"]


def test_a_sigterm_while_sampling_stops_the_run_instead_of_training_on_part_of_the_groups(tmp_path):
    """SIGTERM (a scheduler stopping the job) reaches the rollout, which writes the episodes that finished and
    returns; the online run stops there with it, instead of updating on part of the iteration's groups (which a
    resumed run would take as trained and never train on the rest)."""
    import threading

    from halo_agent.rollout import run as rollout_run
    from halo_data.lake import Lake
    from halo_data.runs import existing_run
    from halo_train import online
    from halo_train.testing import small_online_config

    cfg = small_online_config("base", tmp_path, engine_url="http://127.0.0.1:9/v1", seeds_per_iteration=8)
    Lake.init(cfg.lake)

    def stop_once_sampling():
        while signal.getsignal(signal.SIGTERM) is not rollout_run._raise_keyboard_interrupt:
            time.sleep(0.02)
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # never the worker's death, whatever the timing
    try:
        threading.Thread(target=stop_once_sampling, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            online._rollout(cfg, None, "base", online.Served(None, 0), "online-k0", 0, cfg.group_size, "rollout",
                            policy="random", task_seeds=cfg.seeds_per_iteration)
    finally:
        signal.signal(signal.SIGTERM, previous)
    run = existing_run(Lake.open(cfg.lake), "online-k0")
    assert run is not None and run["status"] == "interrupted"
    written = query(cfg.lake, "select count(*) n from episodes")[0]["n"]
    assert written < len(TASKS) * cfg.group_size * cfg.seeds_per_iteration


def test_resume_writes_the_metrics_of_an_iteration_killed_between_its_record_and_its_metrics(tmp_path, monkeypatch):
    """record_iteration upserts the runs row, then appends the iteration's metrics; a kill between the two leaves
    the iteration recorded (so --resume skips it) without its train_metrics rows, which the resume writes."""
    from halo_data.lake import Lake
    from halo_train import online, served
    from halo_train.testing import small_online_config

    cfg = small_online_config("base", tmp_path, engine_url="http://127.0.0.1:9/v1")
    Path(cfg.output_dir).mkdir(parents=True)
    lake = Lake.init(cfg.lake)
    record, iterations = served.start_record(cfg, lake, "online", "online-grpo", "grpo_groups", online.OnlineError)
    it = {"iteration": 0, "metrics": {"rewards/mean": 0.25, "success_rate/train": 0.5}, "lineage": {"steps": 1},
          "served_after": {"name": None, "version": 0, "path": None}}

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(served, "_write_metrics", killed)
    with pytest.raises(KeyboardInterrupt):
        online.record_iteration(lake, record, cfg, iterations, it, online.Served(None, 0))
    monkeypatch.undo()
    assert query(cfg.lake, "select count(*) n from train_metrics") == [{"n": 0}]

    resumed = small_online_config("base", tmp_path, engine_url="http://127.0.0.1:9/v1", resume=True)
    for _ in range(2):  # a second resume writes nothing twice
        _, recorded = served.start_record(resumed, lake, "online", "online-grpo", "grpo_groups", online.OnlineError)
        assert [r["iteration"] for r in recorded] == [0]
        rows = query(cfg.lake, "select step, metric, value from train_metrics where run_id = 'online' order by metric")
        assert rows == [{"step": 0, "metric": "rewards/mean", "value": 0.25}, {"step": 0, "metric": "success_rate/train", "value": 0.5}]


@pytest.mark.parametrize("extra, message", [
    (["--engine-url", "http://127.0.0.1:9/v1", "--engine-wait", "0"], "Error: no engine answered at http://127.0.0.1:9/v1 within 0 s"),
    (["--serve", "--base-model", "/nonexistent/model"], "Error: base model folder /nonexistent/model does not exist"),
    (["--serve", "--eval-seed-start", "1", "--iterations", "3"], "Error: train task seeds 0..2 overlap held-out seeds 1..2"),
    (["--serve", "--eval-seed-start", "5", "--iterations", "3", "--seeds-per-iteration", "2"],
     "Error: train task seeds 0..5 overlap held-out seeds 5..6"),
    (["--serve", "--group-by", "step"], "Error: Invalid value for '--group-by'"),
    (["--serve", "--choice-labels"], "Error: --choice-labels labels the choices of constrained decoding: add --constrain-actions"),
    (["--serve", "--replay-iterations", "0"], "Error: --replay-iterations must be at least 1"),
    (["--serve", "--target-kl", "-0.01"], "Error: --target-kl must be positive, or 0 for no early stop, got -0.01"),
    # Repeated as halo-agent rollout takes them: one list, each KEY=VALUE checked.
    (["--serve", "--env-option", "success=full", "--env-option", "bad"], "Error: --env-options 'bad': write KEY=VALUE"),
    (["--serve", "--epsilon-high", "0"], "Error: --epsilon must lie in (0, 1) and --epsilon-high be positive"),
    (["--serve", "--lora-dropout", "1"], "Error: --lora-dropout must be in [0, 1), got 1.0"),
    (["--serve", "--mini-batch-size", "0"], "Error: --mini-batch-size must be at least 1, got 0"),
    (["--serve", "--warmup-steps", "-1"], "Error: --warmup-steps must be 0 or more, got -1"),
    (["--serve", "--env-options", "success"], "Error: --env-options 'success': write KEY=VALUE"),
])
def test_bad_input_is_one_error_line(tiny, tmp_path, extra, message):
    from click.testing import CliRunner

    from halo_train.cli import main

    args = ["online-grpo", "--base-model", tiny, "--lake", str(tmp_path / "lake"), "--output-dir", str(tmp_path / "out"), *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith(message), result.output
    assert "Traceback" not in result.output


def test_a_run_that_cannot_start_or_resume_changes_nothing(tiny, tmp_path):
    """Each refusal comes before the engine starts, and leaves the lake and the output folder as they were."""
    from halo_data.lake import Lake
    from halo_train.online import OnlineError, run_online
    from halo_train.served import STATE_FILE, start_record

    with pytest.raises(OnlineError, match="nothing to resume in .*: no online_run.json"):
        run_online(online_config(tiny, tmp_path, serve=True, resume=True, run_id=None))
    (tmp_path / "out" / "policy-1").mkdir(parents=True)
    with pytest.raises(OnlineError, match="already holds policy-\\* adapters of another run: pass --resume"):
        run_online(online_config(tiny, tmp_path, serve=True))
    assert not (tmp_path / "lake").exists() or not query(str(tmp_path / "lake"), "select * from runs")
    # A run the lake holds, then a --resume that names one it does not: the output folder still names the first.
    start_record(online_config(tiny, tmp_path, serve=True), Lake.init(tmp_path / "lake"), "online", "online-grpo", "grpo_groups", OnlineError)
    state = (tmp_path / "out" / STATE_FILE).read_text()
    with pytest.raises(OnlineError, match="run 'other' is not in .*: start it without --resume"):
        run_online(online_config(tiny, tmp_path, serve=True, resume=True, run_id="other"))
    assert (tmp_path / "out" / STATE_FILE).read_text() == state and '"run_id": "online"' in state
    # A --resume that would train the run differently from how it started: refused, the run's record as it was.
    before = query(str(tmp_path / "lake"), "select config from runs where run_id = 'online'")
    with pytest.raises(OnlineError, match=r"--resume continues run 'online' with the options it started with: "
                                          r"--group-size 2 \(it started with --group-size 4\), --lr 0.5 \(it started with "
                                          r"--lr 0.01\), --no-share-prompts \(it started with --share-prompts\), no "
                                          r"--train-steps \(it started with --train-steps 1\); give those"):
        run_online(online_config(tiny, tmp_path, serve=True, resume=True, group_size=2, lr=0.5, share_prompts=False, train_steps=None))
    assert query(str(tmp_path / "lake"), "select config from runs where run_id = 'online'") == before
    # --target-kl 0 and no target are one option, recorded and compared as none.
    with pytest.raises(OnlineError, match=r"started with: --target-kl 0 \(it started with --target-kl 0.02\); give"):
        run_online(online_config(tiny, tmp_path, serve=True, resume=True, target_kl=0.0))
    unguarded = online_config(tiny, tmp_path, serve=True, target_kl=0.0, run_id="unguarded")
    start_record(unguarded, Lake.open(tmp_path / "lake"), "unguarded", "online-grpo", "grpo_groups", OnlineError)
    assert json.loads(query(str(tmp_path / "lake"), "select config from runs where run_id = 'unguarded'")[0]["config"])["target_kl"] is None
    resumed = online_config(tiny, tmp_path, engine_url="http://127.0.0.1:9/v1", resume=True, target_kl=None, run_id="unguarded")
    assert start_record(resumed, Lake.open(tmp_path / "lake"), "unguarded", "online-grpo", "grpo_groups", OnlineError)[1] == []
    # How far it goes, its evaluations and its engine may change.
    resumed = online_config(tiny, tmp_path, engine_url="http://127.0.0.1:9/v1", resume=True, iterations=5, eval_every=1)
    record, done = start_record(resumed, Lake.open(tmp_path / "lake"), "online", "online-grpo", "grpo_groups", OnlineError)
    assert (record.run_id, done, json.loads(record.row()["config"])["eval_every"]) == ("online", [], 1)


def test_constrained_decoding_on_the_compact_page_every_answer_parses(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_train.grpo import stored_completion_logprob
    from halo_train.online import run_online

    with chat_server_in_process(tiny) as url:
        cfg = online_config(tiny, tmp_path, engine_url=url, iterations=1, tasks=["click-button"], group_size=2,
                            seeds_per_iteration=2, constrain_actions=True, observation="elements",
                            reward_config=str(REPO / "halo_agent" / "configs" / "rewards-success.yaml"))
        summary = run_online(cfg, echo=lambda line: None)

    steps = query(cfg.lake, "select task_seed, parse_error, action, model_output, prompt, prompt_version, logprob_sum, "
                            f"{TOKEN_COLUMNS} from steps order by episode_id, step_idx")
    assert {s["task_seed"] for s in steps} == {0, 1}  # two train task seeds in the iteration, a group each
    assert all(s["parse_error"] is None and s["action"] == s["model_output"] for s in steps)
    assert {s["prompt_version"] for s in steps} == {"halo-prompt-v3-elements"}
    page, goal = json.loads(steps[0]["prompt"])[1]["content"].split("Page:\n", 1)[1].rsplit("\nGoal: ", 1)
    assert page and all(line.startswith("[") and line.endswith("'") for line in page.splitlines())
    assert goal.endswith("\nNext action:")  # the goal after the page, right before the answer
    # Success-only weights, in the rollout's rewards and in the views the iteration's figures come from.
    weights = query(cfg.lake, "select distinct reward_weights from steps")
    assert [json.loads(w["reward_weights"])["progress"] for w in weights] == [0.0]
    successes = query(cfg.lake, "select avg(success::double) s from episodes")[0]["s"]
    assert summary.iterations[0]["metrics"]["rewards/mean"] <= successes + 1e-9  # success, less loop penalties
    # The stored behaviour logprob is what the trainer computes for the same tokens under the masked draw of v0.
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny)
    for s in steps[:3]:
        assert s["draw"] == "masked_choice"
        assert s["logprob_sum"] == pytest.approx(stored_completion_logprob(model, tokenizer, s), abs=1e-3)


def test_labelled_choices_are_sampled_stored_and_trained_with_their_labels(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_agent.actions import parse_action
    from halo_train.grpo import stored_completion_logprob
    from halo_train.online import run_online
    from halo_train.tiny_model import build_tiny_model
    from halo_train.trainer_utils import STATS_FILE

    # Untrained weights: the choices are near equally likely, so the groups have a reward spread to train on.
    tiny = str(build_tiny_model(tmp_path / "tiny"))
    with chat_server_in_process(tiny) as url:
        cfg = online_config(tiny, tmp_path, engine_url=url, iterations=2, tasks=["click-button"], group_size=4,
                            seeds_per_iteration=2, constrain_actions=True, choice_labels=True, observation="elements",
                            replay_iterations=2, max_staleness=1, epsilon_high=0.28)
        summary = run_online(cfg, echo=lambda line: None)

    steps = query(cfg.lake, "select run_id, policy_version, parse_error, action, model_output, prompt, logprob_sum, "
                            f"{TOKEN_COLUMNS} from steps order by run_id, episode_id, step_idx")
    assert steps and all(s["parse_error"] is None for s in steps)
    for s in steps:  # the answer names its element first; the action that ran is the canonical call
        label, call = s["model_output"].split("\n", 1)
        assert label.startswith("# ") and call == s["action"] == parse_action(s["model_output"])[0]
        page = json.loads(s["prompt"])[1]["content"]
        bid = s["action"].split("'")[1]
        line = next(line for line in page.splitlines() if line.startswith(f"[{bid}] "))
        assert line.endswith(label[2:]) or label[2:] == line.split()[1]  # the element's name as the page shows it, or its role
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny), AutoTokenizer.from_pretrained(tiny)
    for s in [s for s in steps if s["policy_version"] == "0"][:3]:  # the behaviour logprob includes the label
        assert s["logprob_sum"] == pytest.approx(stored_completion_logprob(model, tokenizer, s), abs=1e-3)

    # --replay-iterations 2: an update after iteration 1 reads both iterations' groups (v0's rows are 1 version stale).
    trained = [it for it in summary.iterations if it["update"] == "trained"]
    assert trained, "no iteration had a reward spread to train on"
    for it in trained:
        stats = json.loads((Path(it["adapter"]) / STATS_FILE).read_text())
        where = json.dumps(stats)
        runs = [f"online-k{j}" for j in range(it["iteration"] + 1)][-2:]
        assert all(r in where for r in runs), where[:500]
        update = json.loads(query(cfg.lake, f"select config from runs where run_id = 'online-u{it['iteration'] + 1}'")[0]["config"])
        assert (update["epsilon"], update["epsilon_high"]) == (0.2, 0.28)  # the clip range reaches each update
