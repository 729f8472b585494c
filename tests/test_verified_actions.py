"""The verified action cache view (``verified_actions``) and the per-episode cost view, from input rows to expected rows.

    task T (site miniwob), all starting from state S0:
      w1 success  S0 click('12') -> S1 (state changed) | S1 click('13') success
      w2 success  S0 click('40') on the same button (ids differ between loads) -> S1 | S1 click('13') success
      f1 failure  S0 click('12') -> S1 | S1 click('14') nothing
      f2 failure  S0 click('15') stays on S0 (no progress) | S0 click('15')
      x1 error    S0 click('16') -> S1 (errored episodes count for nothing)
"""

from __future__ import annotations

import pytest

from halo_data import ids
from test_views import build, episode, rows, step

T = "miniwob.click-t"


def page(state: str, bid: str, label: str) -> dict:
    """A step on page ``state`` whose button ``label`` has element id ``bid``."""
    row = step(state, f"click('{bid}')")
    row["observation"] = f"RootWebArea 'page {state}'\n\t[{bid}] button '{label}'"
    row["state_hash"] = ids.state_hash(row["url"], row["observation"])
    return row


def test_verified_actions_support_success_rate_and_element_text(tmp_path):
    lake = build(tmp_path / "lake", [
        (episode("r", T, 0, success=True), [page("S0", "12", "Next"), {**page("S1", "13", "Done"), "r_success": 1.0}]),
        (episode("r", T, 1, success=True), [page("S0", "40", "Next"), {**page("S1", "13", "Done"), "r_success": 1.0}]),
        (episode("r", T, 2), [page("S0", "12", "Next"), page("S1", "14", "Other")]),
        (episode("r", T, 3), [page("S0", "15", "Stay"), page("S0", "15", "Stay")]),
        (episode("r", T, 4, error="browser crashed"), [page("S0", "16", "Next")]),
    ])
    s0 = ids.state_hash("http://site/S0", "RootWebArea 'page S0'\n\t button 'Next'")
    s1 = ids.state_hash("http://site/S1", "RootWebArea 'page S1'\n\t button 'Done'")
    got = rows(lake, "select scope, key, state_hash, action, action_template, target, support, tries, success_rate, action_rank "
                     "from verified_actions order by scope, state_hash, action_rank")
    expected = []
    for scope, key in (("site", "miniwob"), ("task", T)):
        for state, action, target, support, tries, rate in sorted(
            [(s0, "click('12')", "button 'Next'", 2, 3, 2 / 3), (s1, "click('13')", "button 'Done'", 2, 2, 1.0)]
        ):
            expected.append(dict(scope=scope, key=key, state_hash=state, action=action, action_template="click(<bid>)",
                                 target=target, support=support, tries=tries, success_rate=rate, action_rank=1))
    assert got == expected


def test_verified_actions_ranks_by_support_and_leaves_out_cache_replays(tmp_path):
    two_buttons = "RootWebArea 'page S0'\n\t[20] button 'Next'\n\t[21] button 'Back'"

    def s0(bid: str, **fields) -> dict:
        return {**step("S0", f"click('{bid}')"), "observation": two_buttons,
                "state_hash": ids.state_hash("http://site/S0", two_buttons), **fields}

    done = {**page("S1", "13", "Done"), "r_success": 1.0}
    lake = build(tmp_path / "lake", [
        (episode("r", T, 0, success=True), [s0("20"), done]),
        (episode("r", T, 1, success=True), [s0("21"), done]),
        (episode("r", T, 2, success=True), [s0("21"), done]),
        (episode("r", T, 3, success=True), [s0("20", action_source="cache"), done]),
    ])
    state = ids.state_hash("http://site/S0", two_buttons)
    got = rows(lake, f"select target, support, action_rank from verified_actions "
                     f"where scope = 'task' and state_hash = '{state}' order by action_rank")
    assert got == [dict(target="button 'Back'", support=2, action_rank=1), dict(target="button 'Next'", support=1, action_rank=2)]


def test_a_failed_cache_replay_invalidates_its_entry_in_later_snapshots(tmp_path):
    done = {**page("S1", "13", "Done"), "r_success": 1.0}
    first = [(episode("r", T, 0, success=True), [page("S0", "12", "Next"), done])]
    lake = build(tmp_path / "lake", first)
    assert rows(lake, "select count(*) n from verified_actions where scope = 'task'") == [{"n": 2}]
    # a later run replayed the S0 entry and the page stayed where it was (no progress): the entry is gone
    stuck = {**page("S0", "30", "Next"), "action_source": "cache"}
    from halo_data.writer import EpisodeWriter

    with EpisodeWriter(lake) as writer:
        writer.write_episode(episode("r2", T, 0), [stuck, page("S0", "30", "Next")])
    assert rows(lake, "select target from verified_actions where scope = 'task'") == [{"target": "button 'Done'"}]


def cost_episodes() -> list:
    """Two episodes of mode 'hier': manager calls (gpt-4o), worker calls (qwen), a cache hit and a macro step."""
    def call(source, model, tokens_in, tokens_out, cost, **fields):
        return {**page("S0", "12", "Next"), "action_source": source, "call_model": model, "prompt_tokens": tokens_in,
                "completion_tokens": tokens_out, "cost_usd": cost, **fields}

    manager = {"action": None, "action_valid": None, "model_output": "PLAN: next"}
    return [
        (episode("r", T, 0, mode="hier", success=True), [
            call("manager", "gpt-4o", 100, 10, 0.00035, **manager),
            call("worker", "qwen", 50, 5, 0.0),
            {**page("S1", "13", "Done"), "action_source": "cache"},
            call("manager", "gpt-4o", 120, 12, 0.00042, **manager),
            {**page("S1", "13", "Done"), "action_source": "macro", "macro": "close_modal"},
        ]),
        (episode("r", T, 1, mode="hier"), [call("worker", "qwen", 60, 6, 0.0)]),
    ]


def test_episode_costs_and_eval_matrix_count_calls_tokens_cost_and_sources_per_mode(tmp_path):
    lake = build(tmp_path / "lake", cost_episodes())
    got = rows(lake, "select model, role, calls, prompt_tokens, completion_tokens, cost_usd from episode_costs order by calls desc, role")
    assert got == [dict(model="gpt-4o", role="manager", calls=2, prompt_tokens=220, completion_tokens=22, cost_usd=pytest.approx(0.00077)),
                   dict(model="qwen", role="worker", calls=1, prompt_tokens=50, completion_tokens=5, cost_usd=0.0),
                   dict(model="qwen", role="worker", calls=1, prompt_tokens=60, completion_tokens=6, cost_usd=0.0)]
    got = rows(lake, "select n_episodes, mean_model_calls, mean_prompt_tokens, mean_completion_tokens, mean_cost_usd, "
                     "manager_call_rate, cache_hit_rate from eval_matrix")
    assert got == [dict(n_episodes=2, mean_model_calls=2.0, mean_prompt_tokens=165.0, mean_completion_tokens=16.5,
                        mean_cost_usd=pytest.approx(0.000385), manager_call_rate=2 / 4, cache_hit_rate=1 / 4)]
    got = rows(lake, "select n_steps, n_actions, n_policy_steps, n_manager_calls, n_cache_hits, n_macro_steps, n_invalid_actions "
                     "from episodes where success")
    assert got == [dict(n_steps=5, n_actions=3, n_policy_steps=1, n_manager_calls=2, n_cache_hits=1, n_macro_steps=1, n_invalid_actions=0)]


def test_manager_rows_are_no_training_rows_for_the_worker(tmp_path):
    def advice(text):  # the same manager prompt in both episodes, different answers
        return {**page("S0", "12", "Next"), "action_source": "manager", "action": None, "action_valid": None, "model_output": text}

    lake = build(tmp_path / "lake", [
        (episode("r", T, 0, success=True), [advice("PLAN: a"), {**page("S0", "12", "Next"), "r_success": 1.0}]),
        (episode("r", T, 1), [advice("PLAN: b"), page("S0", "12", "Next")]),
    ])
    assert rows(lake, "select count(*) n from dpo_pairs") == [{"n": 0}]
    assert rows(lake, "select count(*) n from bc_rows where completion like 'PLAN%'") == [{"n": 0}]
    assert rows(lake, "select count(*) n from grpo_groups where completion like 'PLAN%'") == [{"n": 0}]
