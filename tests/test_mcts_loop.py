"""halo-train mcts end to end on CPU: a tiny model served by HALO's chat server searches MiniWoB++ in Chromium,
its trees land in the lake, DPO trains on their pairs, the new adapter is loaded and searches again; killed with -9,
the run resumes where it stopped."""

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

# a tiny model warmed up, served, searched with and trained twice: minutes on a loaded 2-core machine
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(1200)]

TASKS = ["click-button-sequence"]
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny(build_once) -> str:
    """A tiny model warmed up on random-policy steps, so its samples parse as actions."""
    from halo_train.testing import warm_tiny_model

    return build_once("mcts-loop", lambda root: warm_tiny_model(root, TASKS, max_steps=2))


def test_search_pairs_dpo_reload_search_again_and_resume_after_kill_9(tiny, tmp_path):
    """`halo-train mcts` from a warm-start adapter, in its own process against an engine already running (HALO's chat server here, as a vLLM
    server would be), killed with -9 once it saved its first version (the next search is then usually under way),
    then `--resume`d against the same engine to the end: every iteration recorded once, every tree whole and once,
    the saved version adopted rather than trained again."""
    from safetensors.torch import load_file

    from halo_data.lake import Lake
    from halo_train.testing import chat_server_in_process

    lake_path, out = tmp_path / "lake", tmp_path / "out"
    warm = tmp_path / "warm"  # a warm start (an SFT adapter would be one): served as agentq-policy-0, its rank kept
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])).save_pretrained(warm)
    # theta 0: any Q difference between tried siblings is a pair
    args = ["--base-model", tiny, "--tasks", ",".join(TASKS), "--iterations", "2", "--task-seeds", "2",
            "--simulations", "6", "--expansions", "4", "--max-depth", "2", "--theta", "0", "--train-steps", "1", "--lr", "0.01",
            "--init-adapter", str(warm), "--max-tokens", "16", "--lake", str(lake_path), "--output-dir", str(out),
            "--run-id", "agentq", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = out / "policy-1" / "adapter_model.safetensors"
    with chat_server_in_process(tiny) as url, open(tmp_path / "killed.out", "w") as killed_out:
        args += ["--engine-url", url]
        proc = subprocess.Popen(_cli(*args), env=env, start_new_session=True, stdout=killed_out, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        saved = (first.read_bytes(), first.stat().st_mtime_ns) if first.exists() else None
        done = subprocess.run(_cli(*args, "--resume"), env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for text in ((tmp_path / "killed.out").read_text(), done.stdout) for line in text.splitlines()
             if line.startswith("iteration ")]
    # A line is printed once its iteration is recorded, never twice (a kill between the two loses the line, not the record).
    printed = [line.split(":")[0] for line in lines]
    assert printed == sorted(set(printed)) and printed[-1] == "iteration 1", lines
    # The resume's first line says how many iterations the killed run recorded: those it printed, or one more.
    killed_lines = [line for line in (tmp_path / "killed.out").read_text().splitlines() if line.startswith("iteration ")]
    first_line = done.stdout.splitlines()[0]
    if first_line.startswith("resuming"):
        recorded = int(first_line.split("iterations 0-")[1].split()[0]) + 1
        left = "1 more to do" if recorded == 1 else "none more to do at --iterations 2"
        assert first_line.startswith("resuming run agentq: iterations 0-") and f" recorded, {left}, serving " in first_line
        assert recorded in (len(killed_lines), len(killed_lines) + 1), (first_line, killed_lines)
    else:
        assert first_line.startswith("iteration 0:") and not killed_lines

    lake = Lake.open(lake_path)
    trees = lake.query_arrow("select run_id, count(distinct tree_id) as trees, count(*) = count(distinct (tree_id, node_id)) as once, "
                             "max(logprob_sum) is not null as logprobs from mcts_nodes group by run_id order by run_id").to_pylist()
    assert trees == [dict(run_id="agentq-k0", trees=2, once=True, logprobs=True), dict(run_id="agentq-k1", trees=2, once=True, logprobs=True)]
    run = lake.query_arrow("select status, job_type, config from runs where run_id = 'agentq'").to_pylist()[0]
    assert (run["status"], run["job_type"]) == ("finished", "mcts")
    iterations = json.loads(run["config"])["iterations"]
    assert [it["iteration"] for it in iterations] == [0, 1]  # each recorded once
    # a search whose tiny-model samples all agree has no siblings to pair: some iteration must have had pairs
    trained = [it for it in iterations if it["update"] == "trained"]
    assert trained and trained[0]["metrics"]["pairs"] > 0, lines
    version = trained[0]["served_after"]["version"]
    assert saved is None or (first.read_bytes(), first.stat().st_mtime_ns) == saved  # adopted, not written again
    weights = load_file(str(out / f"policy-{version}" / "adapter_model.safetensors"))
    assert any(float(v.abs().sum()) > 0 for k, v in weights.items() if "lora_B" in k)  # DPO moved the adapter
    adapter = json.loads((out / f"policy-{version}" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (8, 16)  # trained on from the warm start
    first_search = lake.query_arrow("select adapter from runs where run_id = 'agentq-k0'").to_pylist()
    assert first_search == [{"adapter": "agentq-policy-0"}]  # which the first search sampled with
    assert (out / f"policy-{version}" / "learner_state.pt").exists()  # the persistent learner's state beside it
    assert trained[0]["served_after"]["name"] == f"agentq-policy-{version}"
    for later in iterations[trained[0]["iteration"] + 1:]:  # every later search samples with the new version
        sampled = lake.query_arrow("select distinct policy_version from mcts_nodes where run_id = $r",
                                   {"r": later["search_run"]}).to_pylist()
        assert sampled == [{"policy_version": str(version)}]
    metrics = lake.query_arrow("select step, metric, count(*) as n from train_metrics where run_id = 'agentq' group by all").to_pylist()
    assert {m["n"] for m in metrics} == {1}  # nothing written twice
    assert {"trees", "pairs", "solved_rate/search", "reload_seconds", "loss"} <= {m["metric"] for m in metrics}
    assert not {"early_stopped", "stop_kl"} & {m["metric"] for m in metrics}  # --target-kl guards GRPO's ratios only
    updates = lake.query_arrow("select run_id, count(*) as n from runs where run_id like 'agentq-u%' group by all order by run_id").to_pylist()
    assert updates == [{"run_id": f"agentq-u{v}", "n": 1} for v in range(1, len(trained) + 1)]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "halo_train.cli", "mcts", *args]


def test_a_refused_reload_keeps_searching_with_the_served_version_and_trains_on_from_the_newest(tiny, tmp_path, monkeypatch):
    """The engine refuses a new version (as vLLM refuses an adapter it cannot serve): the next search samples with
    the version still served, and the next update continues from the newest trained one into a new folder."""
    from halo_agent.chat_server import ChatCompletionServer, RequestError
    from halo_data.lake import Lake
    from halo_train.mcts import MCTSConfig, run_mcts
    from halo_train.testing import chat_server_in_process

    def refuse(self, body):
        raise RequestError("rank 16 is greater than max_lora_rank 8", status=400, kind="BadRequestError")

    monkeypatch.setattr(ChatCompletionServer, "load_lora_adapter", refuse)
    lines: list[str] = []
    with chat_server_in_process(tiny) as url:
        cfg = MCTSConfig(base_model=tiny, tasks=TASKS, iterations=2, task_seeds=2, simulations=6, expansions=4, max_depth=2,
                         theta=0.0, train_steps=1, lr=0.01, lora_alpha=16, max_tokens=16, engine_url=url,
                         lake=str(tmp_path / "lake"), output_dir=str(tmp_path / "out"), run_id="refused", progress=False)
        summary = run_mcts(cfg, echo=lines.append)
    assert summary.served is None and all("400 rank 16 is greater than max_lora_rank 8" in line for line in lines), lines
    sampled = Lake.open(cfg.lake).query_arrow("select distinct run_id, policy_version from mcts_nodes order by run_id").to_pylist()
    assert sampled == [{"run_id": "refused-k0", "policy_version": "0"}, {"run_id": "refused-k1", "policy_version": "0"}]
    trained = [Path(it["adapter"]).name for it in summary.iterations if it["update"] == "trained"]
    assert trained == ["policy-1", "policy-2"][:len(trained)] and trained, lines  # each update a new version
