"""halo-train online-grpo --pipeline (iteration k's update overlapping iteration k+1's rollout) and --serve's engine
choice: real chat server, Chromium, lake and tiny model; only vLLM (a GPU program) is stood in for by an executable.
A pipelined run killed with -9 and resumed is test_online_grpo's module run."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# The online tests' model (their module-scoped fixture, one per module), task list and helpers.
from test_online_grpo import REPO, TASKS, lora_weights, query, tiny  # noqa: E402,F401


def online_config(tiny: str, tmp_path: Path, **overrides):
    from halo_train.testing import small_online_config

    return small_online_config(tiny, tmp_path, **{"tasks": TASKS, "seeds_per_iteration": 2, "pipeline": True, **overrides})


def test_two_pipelined_iterations_sample_with_the_served_version_and_train_on_one_stale_rows(tiny, tmp_path):
    from halo_train.online import run_online
    from halo_train.testing import chat_server_in_process
    from halo_train.trainer_utils import STATS_FILE

    with chat_server_in_process(tiny) as url:
        cfg = online_config(tiny, tmp_path, engine_url=url)
        lines: list[str] = []
        summary = run_online(cfg, echo=lines.append)

    out = Path(cfg.output_dir)
    assert [line.split(":")[0] for line in lines] == ["iteration 0", "iteration 1"]
    assert all("{" not in line for line in lines)
    assert "-> policy-1, reload" in lines[0] and "-> policy-2, reload" in lines[1]
    assert summary.served == "online-policy-2"
    one, two = lora_weights(out / "policy-1"), lora_weights(out / "policy-2")
    assert any(not torch.equal(one[k], two[k]) for k in one), "the second update changed no adapter weight"

    # Iteration 1 sampled while update 0 trained: with version 0, the one still served, and its rows say so.
    rows = query(cfg.lake, "select run_id, policy_version, count(*) n from episodes group by all order by run_id")
    assert [(r["run_id"], r["policy_version"], r["n"]) for r in rows] == [("online-k0", "0", 16), ("online-k1", "0", 16)]
    iterations = json.loads(query(cfg.lake, "select config from runs where run_id = 'online'")[0]["config"])["iterations"]
    assert [it["sampled_version"] for it in iterations] == [0, 0]
    assert iterations[0]["next_rollout"] == {"run": "online-k1", "name": None, "version": 0, "path": None}
    assert [it["served_after"]["name"] for it in iterations] == ["online-policy-1", "online-policy-2"]

    # Update 1 continued policy-1 on iteration 1's rows, sampled by version 0: one version stale, none dropped.
    stats = json.loads((out / "policy-2" / STATS_FILE).read_text())
    assert stats["config"]["init_adapter"] == str((out / "policy-1").resolve())
    assert stats["where"] == "run_id = 'online-k1' and policy_version = '0'"
    assert stats["rows"] > 0 and stats["dropped_rows"] == 0 and stats["metrics"]["frac_rows_off_policy"] == 1.0

    metrics = {(m["step"], m["metric"]): m["value"] for m in query(
        cfg.lake, "select step, metric, value from train_metrics where run_id = 'online'")}
    assert metrics[(0, "pipeline_overlap_seconds")] > 0  # update 0 and rollout 1 ran at the same time
    assert metrics[(1, "pipeline_overlap_seconds")] == 0  # the last update has no rollout to overlap
    assert all(metrics[(s, "iteration_seconds")] > 0 and (s, "update_seconds") in metrics for s in (0, 1))


STAND_IN = """#!{python}
# Stands in for vLLM's `vllm` command where vLLM cannot run (no GPU): records what it was given, then serves
# the base model with HALO's chat server on the port vLLM was told to use.
import json, os, sys
args = sys.argv[1:]
with open({record!r}, "w") as f:
    json.dump({{"argv": args, "runtime_lora": os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
               "pid": os.getpid(), "pgid": os.getpgid(0)}}, f)
flags = {{"--host": 1, "--port": 1, "--enable-lora": 0, "--max-loras": 1, "--max-lora-rank": 1, "--max-model-len": 1,
         "--logprobs-mode": 1, "--generation-config": 1}}
i = 2
while i < len(args):  # vLLM's own argument parser refuses what it does not know; so does this one
    if args[i] not in flags:
        sys.exit(f"vllm: error: unrecognized arguments: {{args[i]}}")
    i += 1 + flags[args[i]]
assert args[0] == "serve" and args[args.index("--host") + 1] == "127.0.0.1"
os.execv(sys.executable, [sys.executable, "-m", "halo_agent.chat_server", "--model", args[1],
                          "--port", args[args.index("--port") + 1], "--device", "cpu"])
"""


def stand_in_vllm(folder: Path) -> Path:
    """A `vllm` executable in ``folder``; returns the file it records its arguments, environment and pid in."""
    record = folder / "vllm-called.json"
    exe = folder / "vllm"
    exe.write_text(STAND_IN.format(python=sys.executable, record=str(record)))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return record


def test_serve_starts_vllm_with_runtime_lora_waits_for_it_and_ends_its_process_group(tiny, tmp_path, monkeypatch):
    from halo_train.online import run_online

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = stand_in_vllm(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the GPU vLLM needs (`--engine auto` looks for it)

    cfg = online_config(tiny, tmp_path, serve=True, iterations=1, tasks=["click-button"], group_size=2,
                        seeds_per_iteration=1, max_episode_steps=1, pipeline=False, vllm_args="--max-model-len 2048")
    lines: list[str] = []
    run_online(cfg, echo=lines.append)

    called = json.loads(record.read_text())
    port = called["argv"][called["argv"].index("--port") + 1]
    assert called["argv"] == ["serve", tiny, "--host", "127.0.0.1", "--port", port, "--enable-lora", "--max-loras", "2",
                              "--max-lora-rank", "16", "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
                              "--max-model-len", "2048"]
    assert called["runtime_lora"] == "True"
    assert called["pgid"] == called["pid"]  # its own process group, which the run ended
    with pytest.raises(ProcessLookupError):
        os.killpg(called["pgid"], 0)
    assert lines[0].startswith("iteration 0: sampled v0")
    assert query(cfg.lake, "select count(*) n from episodes")[0]["n"] == 2  # the rollout went through the engine


def test_the_online_vllm_command_line(tmp_path):
    from halo_train.served import vllm_spec
    from halo_train.serve import engine_process, vllm_command

    warm = tmp_path / "sft"
    warm.mkdir()
    (warm / "adapter_config.json").write_text(json.dumps({"r": 24, "peft_type": "LORA"}))
    base = tmp_path / "base"
    base.mkdir()
    cfg = online_config(str(base), tmp_path, serve=True, init_adapter=str(warm), lora_r=8,
                        vllm_args="--gpu-memory-utilization 0.8 --max-model-len 8192")
    spec = vllm_spec(cfg, 8123)
    assert vllm_command(spec) == [
        "vllm", "serve", str(base), "--host", "127.0.0.1", "--port", "8123", "--enable-lora", "--max-loras", "2",
        "--max-lora-rank", "32", "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
        "--gpu-memory-utilization", "0.8",
        "--max-model-len", "8192"]
    name, command, env = engine_process(spec)
    assert (name, command, env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]) == ("vllm", vllm_command(spec), "True")


@pytest.mark.parametrize("extra, message", [
    (["--serve", "--pipeline", "--max-staleness", "0"],
     "Error: --pipeline trains each update on rows one version stale: give --max-staleness 1 or more, not 0"),
    (["--engine-url", "http://127.0.0.1:9/v1", "--engine", "vllm"],
     "Error: --engine vllm picks the engine --serve starts; --engine-url uses one already running: drop one of them"),
    (["--serve", "--engine", "vllm"], "Error: --engine vllm cannot run here: torch sees no CUDA GPU; use --engine chat"),
    (["--serve", "--engine", "gpu"], "Error: Invalid value for '--engine'"),
])
def test_bad_input_is_one_error_line(tmp_path, monkeypatch, extra, message):
    from click.testing import CliRunner

    from halo_train.cli import main

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in_vllm(bin_dir)  # vLLM's command is there; the GPU it needs is not
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    base = tmp_path / "base"
    base.mkdir()
    args = ["online-grpo", "--base-model", str(base), "--lake", str(tmp_path / "lake"), "--output-dir", str(tmp_path / "out"), *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith(message), result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "policy-1").exists()


def test_engine_vllm_without_its_command_is_one_error_line(tmp_path, monkeypatch):
    from halo_train import serve

    monkeypatch.setenv("PATH", str(tmp_path))  # no vllm anywhere on it
    monkeypatch.setattr(serve, "vllm_executable", lambda: None)
    with pytest.raises(serve.ServeError, match="^--engine vllm cannot run here: no vllm command on PATH"):
        serve.check_engine("vllm")
    assert serve.pick_engine("auto") == "chat"
