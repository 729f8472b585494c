"""State restore and per-state candidates on real MiniWoB++ pages in headless Chromium, into a real lake."""

from __future__ import annotations

import dataclasses
import re

import pytest

from halo_data import ids
from halo_data.lake import Lake

pytestmark = pytest.mark.browser


def _spec(name):
    from halo_agent.envs.miniwob import MiniWoBEnv

    return MiniWoBEnv.task_spec(name)


def _hash(page) -> str:
    return ids.state_hash(page.url, page.axtree)


@pytest.fixture(scope="module")
def env():
    from halo_agent.envs.miniwob import MiniWoBEnv

    e = MiniWoBEnv(headless=True)  # isolation=episode: a restore of the same task restarts in place
    yield e
    e.close()


@pytest.fixture(scope="module")
def reward_config():
    from halo_agent.rewards import RewardConfig

    return RewardConfig.load()


def _visit_enter_text(env, seed: int = 5):
    """An enter-text episode's path to its second state: reset, type a word into the box."""
    from halo_agent.restore import StatePath

    task = _spec("enter-text")
    first = env.reset(task, seed)
    box = next(e for e in first.elements if e.kind == "fill")
    action = f"fill('{box.bid}', 'kim')"
    second = env.step(action).page
    assert _hash(second) != _hash(first)
    return StatePath(task, seed, (action,), (_hash(first), _hash(second)), goal=first.goal), second


def _buttons(page):
    wanted = re.search(r'"(.+)"', page.goal).group(1)
    right = next(e for e in page.elements if e.role == "button" and e.name == wanted)
    wrong = next(e for e in page.elements if e.role == "button" and e.name != wanted)
    return right, wrong


def test_restore_reproduces_the_state_by_restart_and_by_fresh_load(env):
    from halo_agent.envs.miniwob import MiniWoBEnv
    from halo_agent.restore import Restored, restore_state

    path, visited = _visit_enter_text(env)
    restarts = env.restarts
    again = restore_state(env, path)
    assert isinstance(again, Restored) and again.restored
    assert env.restarts == restarts + 1  # MiniWoB's in-page restart
    assert again.state_hash == path.target == _hash(visited)
    assert again.page.axtree == visited.axtree

    loading = MiniWoBEnv(isolation="document")
    try:
        loaded = restore_state(loading, path)
        assert loading.restarts == 0  # a fresh load of the task's page
        assert loaded.restored and loaded.state_hash == path.target
    finally:
        loading.close()


def test_a_prefix_that_no_longer_applies_is_not_reproducible(env):
    from halo_agent.restore import NotReproducible, restore_state

    path, _ = _visit_enter_text(env)
    wrong_seed = restore_state(env, dataclasses.replace(path, task_seed=path.task_seed + 1))
    assert isinstance(wrong_seed, NotReproducible) and not wrong_seed.restored
    # enter-text's page does not show the goal: only the goal tells the instances apart
    assert wrong_seed.diverged_at == 0 and "the task instance differs" in wrong_seed.reason

    bogus = restore_state(env, dataclasses.replace(path, actions=("click('9999')",)))
    assert (bogus.restored, bogus.diverged_at) == (False, 1)  # the page stayed at the first state

    class Broken:
        def reset(self, task, task_seed):
            raise RuntimeError("browser crashed\nstack")

    broken = restore_state(Broken(), path)
    assert (broken.restored, broken.diverged_at, broken.reason) == (False, 0, "environment error: RuntimeError: browser crashed")


def _click_button_group(env, reward_config, seed: int = 3):
    from halo_agent.candidates import score_candidates
    from halo_agent.restore import StatePath
    from halo_agent.types import PolicyOutput

    task = _spec("click-button")
    page = env.reset(task, seed)
    right, wrong = _buttons(page)
    samples = [PolicyOutput(model_output=f"click('{b.bid}')", action=f"click('{b.bid}')", logprob_sum=-1.5) for b in (wrong, right)]
    samples.append(PolicyOutput(model_output="I would click it", action=None, parse_error="no action"))
    path = StatePath(task, seed, (), (_hash(page),), goal=page.goal)
    return score_candidates(env, path, samples, reward_config), path


def test_candidates_at_a_state_get_distinct_scores_in_a_real_lake(env, reward_config, tmp_path):
    from halo_agent.candidates import write_candidates

    group, path = _click_button_group(env, reward_config)
    assert group.trainable
    wrong, right, unparsed = group.scores
    w = reward_config.weights
    # the right button: MiniWoB's reward 1, a valid action, a new state, at least the "interacted" milestone
    assert right >= w.success * 1.0 + w.validity * 0.2 + w.novelty * 1.0 + w.progress * 0.25 - 1e-9
    assert wrong < right - w.success + 1e-9  # the same shaping at most, without MiniWoB's reward
    assert unparsed == pytest.approx(w.validity * reward_config.parse_error)  # nothing happened: only the parse error
    assert right > wrong > unparsed

    lake = Lake.init(tmp_path / "lake")
    rows = group.rows(run_id="r1", env="miniwob", episode_id="e1", task_id=path.task.task_id, prompt='[{"role":"user"}]', policy_version="v3")
    assert write_candidates(lake, rows) == 3
    stored = lake.query_arrow("select * from candidates order by candidate_idx").to_pylist()
    assert [(r["candidate_idx"], r["score"], r["score_source"], r["state_hash"], r["step_idx"]) for r in stored] == [
        (0, wrong, "env", path.target, 0), (1, right, "env", path.target, 0), (2, unparsed, "env", path.target, 0)]
    assert stored[0]["prompt_hash"] == ids.sha256_hex('[{"role":"user"}]')
    assert (stored[0]["policy_version"], stored[0]["logprob_sum"], stored[2]["action"]) == ("v3", -1.5, None)
    assert write_candidates(lake, rows) == 0  # the state's candidates are already there

    pairs = lake.query_arrow("select * from dpo_pairs where source = 'candidates'").to_pylist()
    assert [(p["chosen"], p["rejected"], p["chosen_score"], p["rejected_score"]) for p in pairs] == [
        (rows[1]["model_output"], "I would click it", right, unparsed)]


def test_candidates_of_a_state_that_does_not_reproduce_are_never_trainable(env, reward_config, tmp_path):
    from halo_agent.candidates import score_candidates, write_candidates

    group, path = _click_button_group(env, reward_config)
    moved = dataclasses.replace(path, task_seed=path.task_seed + 1)
    flagged = score_candidates(env, moved, group.samples, reward_config)
    assert not flagged.trainable and flagged.scores == (None, None, None)
    assert flagged.unreproducible.diverged_at == 0

    class FailsOnStep:
        """The real environment, whose browser fails when a candidate runs."""

        def reset(self, task, task_seed):
            return env.reset(task, task_seed)

        def step(self, action):
            raise RuntimeError("Target crashed")

    crashed = score_candidates(FailsOnStep(), path, group.samples, reward_config)
    assert not crashed.trainable and crashed.scores == (None, None, None)
    assert crashed.unreproducible.reason.endswith("RuntimeError: Target crashed")

    lake = Lake.init(tmp_path / "lake")
    write_candidates(lake, flagged.rows(run_id="r1", env="miniwob", episode_id="e1", task_id=path.task.task_id, prompt="p", policy_version="v3"))
    stored = lake.query_arrow("select score, score_source from candidates").to_pylist()
    assert stored == [{"score": None, "score_source": "unreproducible"}] * 3
    assert lake.query_arrow("select count(*) as n from dpo_pairs").to_pylist() == [{"n": 0}]


def test_a_rollout_with_candidates_writes_steps_and_candidates_and_resume_adds_none_twice(tmp_path):
    from halo_agent.rollout import RolloutConfig, run_rollouts

    lake_dir = tmp_path / "lake"
    config = RolloutConfig(env="miniwob", tasks=["enter-text"], rollouts_per_task=2, policy="random", seed=1, task_seed=4,
                           max_steps=3, candidates_per_state=3, lake=str(lake_dir), run_id="r-cand", progress=False)
    summary = run_rollouts(config)
    lake = Lake.open(lake_dir)
    steps = lake.query_arrow("select episode_id, step_idx, state_hash, prompt, prompt_hash, action, reward, policy_version from steps").to_pylist()
    candidates = lake.query_arrow("select * from candidates order by episode_id, step_idx, candidate_idx").to_pylist()
    assert summary.candidates == len(candidates) == 3 * len(steps)
    assert max(s["step_idx"] for s in steps) >= 1  # states after actions restore too, not only first pages
    by_step = {(s["episode_id"], s["step_idx"]): s for s in steps}
    for c in candidates:
        step = by_step[(c["episode_id"], c["step_idx"])]
        assert (c["state_hash"], c["prompt"], c["prompt_hash"], c["policy_version"]) == (
            step["state_hash"], step["prompt"], step["prompt_hash"], step["policy_version"])
        assert (c["score_source"], c["run_id"], c["env"], c["task_id"]) == ("env", "r-cand", "miniwob", "miniwob.enter-text")
        assert c["score"] is not None
        if c["candidate_idx"] == 0:
            # the first sample is the action the episode took, and replay scores it as the episode did
            assert (c["action"], c["score"]) == (step["action"], pytest.approx(step["reward"]))

    # an episode whose steps are lost is run again on --resume; its candidates are already in the lake
    lost = steps[0]["episode_id"]
    lake.table("steps").delete(f"episode_id = '{lost}'")
    again = run_rollouts(RolloutConfig(**{**config.__dict__, "resume": True}))
    assert (again.episodes_written, again.candidates) == (1, 0)
    assert lake.query_arrow("select count(*) as n from candidates").to_pylist() == [{"n": len(candidates)}]
    assert lake.query_arrow("select count(*) as n from steps").to_pylist() == [{"n": len(steps)}]


def test_candidates_option_needs_a_group(tmp_path):
    from click.testing import CliRunner

    from halo_agent.cli import main
    from halo_agent.rollout import RolloutConfig, RolloutError

    with pytest.raises(RolloutError, match="--candidates must be 0"):
        RolloutConfig(candidates_per_state=1)
    result = CliRunner().invoke(main, ["rollout", "--tasks", "click-button", "--candidates", "1", "--lake", str(tmp_path / "lake")])
    assert result.exit_code != 0
    assert "Error: --candidates must be 0 (none) or at least 2: a group of one has nothing to compare" in result.output
