"""halo-train mcts end to end on CPU: a tiny model served by HALO's chat server searches MiniWoB++ in Chromium,
its trees land in the lake, DPO trains on their pairs, the new adapter is loaded and searches again."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

# a tiny model warmed up, served, searched with and trained twice: minutes on a loaded 2-core machine
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(1200)]

TASKS = ["click-button-sequence"]


@pytest.fixture(scope="session")
def tiny(build_once) -> str:
    """A tiny model warmed up on random-policy steps, so its samples parse as actions."""
    from halo_train.testing import warm_tiny_model

    return build_once("mcts-loop", lambda root: warm_tiny_model(root, TASKS, max_steps=2))


def test_search_pairs_dpo_reload_and_search_again(tiny, tmp_path):
    from safetensors.torch import load_file

    from halo_data.lake import Lake
    from halo_train.mcts import MCTSConfig, run_mcts

    lines: list[str] = []
    # theta 0: any Q difference between tried siblings is a pair
    cfg = MCTSConfig(base_model=tiny, tasks=TASKS, iterations=2, task_seeds=2, simulations=6, expansions=4, max_depth=2, theta=0.0,
                     train_steps=1, lr=0.01, lora_alpha=16, max_tokens=16, serve=True, lake=str(tmp_path / "lake"),
                     output_dir=str(tmp_path / "out"), run_id="agentq", progress=False)
    summary = run_mcts(cfg, echo=lines.append)
    assert len(summary.iterations) == 2 and len(lines) == 2
    lake = Lake.open(cfg.lake)
    trees = lake.query_arrow("select run_id, count(distinct tree_id) as trees, max(logprob_sum) is not null as logprobs "
                             "from mcts_nodes group by run_id order by run_id").to_pylist()
    assert trees == [dict(run_id="agentq-k0", trees=2, logprobs=True), dict(run_id="agentq-k1", trees=2, logprobs=True)]
    # a search whose tiny-model samples all agree has no siblings to pair: some iteration must have had pairs
    trained = [it for it in summary.iterations if it["update"] == "trained"]
    assert trained and trained[0]["metrics"]["pairs"] > 0, lines
    first = trained[0]
    version = first["served_after"]["version"]
    weights = load_file(str(tmp_path / "out" / f"policy-{version}" / "adapter_model.safetensors"))
    assert any(float(v.abs().sum()) > 0 for k, v in weights.items() if "lora_B" in k)  # DPO moved the adapter
    adapter = json.loads((tmp_path / "out" / f"policy-{version}" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (cfg.lora_r, 16)
    assert first["served_after"]["name"] == f"policy-{version}"
    for later in summary.iterations[first["iteration"] + 1:]:  # every later search samples with the new version
        sampled = lake.query_arrow("select distinct policy_version from mcts_nodes where run_id = $r",
                                   {"r": later["search_run"]}).to_pylist()
        assert sampled == [{"policy_version": str(version)}]
    run = lake.query_arrow("select status, job_type from runs where run_id = 'agentq'").to_pylist()[0]
    assert run == {"status": "finished", "job_type": "mcts"}
    metrics = {r["metric"] for r in lake.query_arrow("select metric from train_metrics where run_id = 'agentq'").to_pylist()}
    assert {"trees", "pairs", "solved_rate/search", "reload_seconds", "loss"} <= metrics
