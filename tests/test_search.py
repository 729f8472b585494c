"""MCTS (halo_agent.search) on real pages in headless Chromium, into a real lake: the search, restore flags,
whole trees after kill -9, the AI critic through HALO's chat server, and one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from halo_data.lake import Lake

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
LOCK = "miniwob.code-lock"  # tests/pages/code-lock.html: the code is A, C, B; "Clock" never replays the same


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> str:
    """A folder of MiniWoB-style pages beside MiniWoB's own core scripts."""
    from halo_agent.envs.miniwob import page_folder

    return page_folder(REPO / "tests" / "pages", tmp_path_factory.mktemp("pages"))


def lock_search(pages: str, lake: str, **options):
    """A search of the code lock with the random policy and the progress critic."""
    from halo_agent.envs.base import TaskSpec
    from halo_agent.envs.miniwob import MiniWoBEnv
    from halo_agent.search import SearchConfig
    from halo_agent.search.run import build_search

    settings = dict(env="miniwob", tasks=["code-lock"], simulations=40, expansions=5, max_depth=4, critic="progress", lake=lake)
    cfg = SearchConfig(**{**settings, **options})
    env = MiniWoBEnv(base_dir=pages)
    try:
        searcher = build_search(cfg, env)
        return searcher, searcher.search(TaskSpec(LOCK, "miniwob", "miniwob"), 0, "lock-tree"), cfg
    finally:
        env.close()


def test_the_search_finds_the_shortest_path_and_flags_states_that_do_not_replay(pages, tmp_path):
    from halo_agent.envs.base import TaskSpec
    from halo_agent.envs.miniwob import MiniWoBEnv

    env = MiniWoBEnv(base_dir=pages)
    try:
        first = env.reset(TaskSpec(LOCK, "miniwob", "miniwob"), 0)
    finally:
        env.close()
    by_bid = {e.bid: e.name for e in first.elements}

    _, result, _ = lock_search(pages, str(tmp_path / "lake"))
    # 5 buttons, code of 3: a random episode succeeds with p = 1/125; 40 simulations find it.
    assert result.simulations <= 40 and result.solved
    win = result.tree.solved()
    assert [by_bid[a.split("'")[1]] for a in win.prefix()] == ["A", "C", "B"] and win.depth == 3 and win.reward == 1.0
    assert [by_bid[n.action.split("'")[1]] for n in result.tree.best_path()[1:]] == ["A", "C", "B"]
    flagged = [n for n in result.tree.nodes() if not n.reproducible]
    mismatched = [n for n in flagged if "where the episode saw" in n.restore_error]  # the replay gave another page
    assert mismatched and all(by_bid[n.action.split("'")[1]] == "Clock" for n in mismatched)
    # what lies under a node that does not reproduce cannot be reached either
    assert all(n in mismatched or n.restore_error.endswith("above it does not reproduce") for n in flagged)
    assert result.env_steps > 0 and result.resets > result.simulations


def test_whole_trees_land_in_the_lake_and_flagged_nodes_make_no_pairs(pages, tmp_path):
    from halo_agent.search.run import write_tree

    lake = Lake.init(tmp_path / "lake")
    _, result, cfg = lock_search(pages, str(tmp_path / "lake"), simulations=24)
    n = write_tree(lake, result, run_id="s", env="miniwob", alpha=cfg.alpha, policy_version="random-v1", sent=set())
    nodes = lake.query_arrow("select * from mcts_nodes order by node_id").to_pylist()
    assert len(nodes) == n == sum(1 for _ in result.tree.nodes())
    by_id = {r["node_id"]: r for r in nodes}
    assert all(r["parent_id"] is None or r["parent_id"] in by_id for r in nodes)
    root = by_id["0"]
    assert root["visits"] > 0 and root["prompt"] and root["screenshot_hash"] and root["replay_prefix"] == []
    child = next(r for r in nodes if r["depth"] == 2 and r["reproducible"])
    assert len(child["replay_prefix"]) == 2 and child["replay_prefix"][-1] == child["action"]
    shots = lake.query_arrow("select count(*) as n from screenshots").to_pylist()[0]["n"]
    assert shots >= 1
    flagged = {r["node_id"] for r in nodes if r["reproducible"] is False}
    pairs = lake.query_arrow("select chosen_node_id, rejected_node_id from mcts_pairs").to_pylist()
    assert pairs and not flagged & ({p["chosen_node_id"] for p in pairs} | {p["rejected_node_id"] for p in pairs})


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "halo_agent.cli", "search", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("args, message", [
    (["--expansions", "0"], "Error: --expansions (K) must be at least 1, got 0\n"),
    (["--critic", "oracle"], "Error: unknown critic 'oracle': use progress or policy, or serve the model and pass --critic-base-url\n"),
    (["--critic", "policy"], "Error: --critic policy needs a model policy served over HTTP (--policy openai), not 'random'\n"),
])
def test_bad_input_is_one_clear_error_line_and_writes_nothing(tmp_path, args, message):
    env = {k: v for k, v in os.environ.items() if k not in ("HALO_VLLM_URL", "OPENAI_BASE_URL")}
    done = subprocess.run([sys.executable, "-m", "halo_agent.cli", "search", "--tasks", "click-button-sequence",
                           "--lake", str(tmp_path / "lake"), *args], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**env, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stderr) == (1, message)
    assert not (tmp_path / "lake").exists()


@pytest.mark.slow
def test_kill_9_leaves_whole_trees_and_resume_searches_the_rest(tmp_path):
    lake_dir = tmp_path / "lake"
    args = ["--tasks", "click-button-sequence,click-checkboxes", "--task-seeds", "2", "--simulations", "4",
            "--max-depth", "2", "--run-id", "s", "--lake", str(lake_dir), "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "halo_agent.cli", "search", *args], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (lake_dir / "mcts_nodes" / "_delta_log" / "00000000000000000001.json").exists():
                break  # the first tree is committed
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    lake = Lake.open(lake_dir)
    killed = lake.query_arrow("select tree_id, count(*) as n, count(*) filter (where parent_id is null) as roots "
                              "from mcts_nodes group by tree_id").to_pylist()
    assert 1 <= len(killed) < 4 and all(r["roots"] == 1 for r in killed)

    done = run_cli(*args, "--resume")
    assert done.returncode == 0, done.stderr
    assert f"({len(killed)} already in the lake, 4 planned)" in done.stdout
    nodes = lake.query_arrow("select tree_id, node_id, parent_id from mcts_nodes").to_pylist()
    assert len({r["tree_id"] for r in nodes}) == 4
    assert len(nodes) == len({(r["tree_id"], r["node_id"]) for r in nodes})  # nothing written twice
    ids = {(r["tree_id"], r["node_id"]) for r in nodes}
    assert all(r["parent_id"] is None or (r["tree_id"], r["parent_id"]) in ids for r in nodes)
    before = {r["tree_id"]: r["n"] for r in killed}
    after = lake.query_arrow("select tree_id, count(*) as n from mcts_nodes group by tree_id").to_pylist()
    assert all(before[r["tree_id"]] == r["n"] for r in after if r["tree_id"] in before)
    run = lake.query_arrow("select status, config from runs where run_id = 's'").to_pylist()[0]
    assert run["status"] == "finished" and '"theta": 0.1' in run["config"] and '"expansions": 4' in run["config"]


@pytest.fixture(scope="module")
def critic_model(tmp_path_factory) -> str:
    """A tiny model warmed up to answer the critic's prompt with a ranking ("2 1"): a real model, served for real."""
    pytest.importorskip("torch")
    from halo_data import prompts
    from halo_data.writer import EpisodeWriter
    from halo_agent.search.critics import critic_messages
    from halo_train.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("critic")
    lake = Lake.init(root / "warm")
    with EpisodeWriter(lake, flush_episodes=100) as writer:
        for i in range(8):
            messages = critic_messages(f"Enter the code {i}", "file:///lock.html", f"[1{i}] button 'A'", [], ["click('10')", "click('11')"])
            writer.write_episode(
                dict(run_id="warm", env="miniwob", task_id=f"miniwob.critic-{i}", site="miniwob", task_seed=i, attempt_idx=0,
                     success=True, task_reward=1.0, terminated=True),
                [dict(prompt=prompts.dumps(messages), model_output="2 1", action="2 1", action_valid=True, goal="g")])
    return str(build_tiny_model(root / "tiny", warmup_lake=root / "warm", steps=30, batch_size=4))


@pytest.mark.slow
def test_the_ai_critic_ranks_through_halos_chat_server(critic_model, pages, tmp_path):
    from halo_agent.chat_server import ChatCompletionServer
    from halo_agent.policies.hf_policy import LocalChatModel
    from halo_agent.search.critics import ChatCritic, CriticError, make_critic
    from halo_agent.rewards import RewardConfig

    with ChatCompletionServer(LocalChatModel(critic_model, device="cpu"), served_model_name="critic") as server:
        critic = make_critic("critic", RewardConfig.load(), base_url=server.url)
        assert isinstance(critic, ChatCritic)
        searcher, result, _ = lock_search(pages, str(tmp_path / "lake"), simulations=6, expansions=2, critic="critic",
                                          critic_base_url=server.url)
        ranked = [n for n in result.tree.nodes() if n.critic_rank is not None]
        assert ranked and {n.critic_rank for n in ranked} == {1, 2}
        # the critic answers "2 1": of the two candidates of one call (consecutive children), the second is the best
        by_id = {n.node_id: n for n in ranked}
        seconds = [n for n in ranked if n.critic_rank == 2]
        assert seconds and all(n.q_critic == 0.0 for n in seconds)
        for n in seconds:
            head, index = n.node_id.rsplit(".", 1)
            best = by_id[f"{head}.{int(index) + 1}"]
            assert (best.critic_rank, best.q_critic) == (1, 1.0)
        assert any(r["model"] == "critic" and r["temperature"] == 0.0 for r in server.received)
        with pytest.raises(CriticError, match="unknown critic 'gpt-4o': the engine at .* serves critic"):
            make_critic("gpt-4o", RewardConfig.load(), base_url=server.url)


@pytest.mark.slow
def test_a_critic_answer_that_does_not_rank_is_one_error_line(tmp_path):
    """An untrained tiny model answers noise: the search stops with one line saying so."""
    pytest.importorskip("torch")
    from halo_agent.chat_server import ChatCompletionServer
    from halo_agent.policies.hf_policy import LocalChatModel
    from halo_train.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "noise")
    with ChatCompletionServer(LocalChatModel(str(model), device="cpu"), served_model_name="noise") as server:
        done = run_cli("--tasks", "click-button-sequence", "--critic", "noise", "--critic-base-url", server.url,
                       "--expansions", "2", "--simulations", "2", "--lake", str(tmp_path / "lake"))
    assert done.returncode == 1
    assert done.stderr.startswith("Error: the critic's answer does not rank the 2 candidates (it named ")
    assert done.stderr.count("\n") == 1
