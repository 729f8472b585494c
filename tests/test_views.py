"""Every SQL view, from hand-written input rows to exact expected rows, on real Delta tables and DuckDB.

The main lake (``lake`` fixture) holds these episodes; rewards are chosen so that
returns and advantages can be worked out by hand:

    task A  miniwob.click-a   run r1  seed 1  policy v0   (3 attempts, ranks 1/2/3)
      e0 success  steps: S0 "click('a')" progress .5 | S1 "click('b')" progress .5 + success 1
      e2 fail     steps: S0 "click('c')" progress .5                    (progress .5 in 1 step)
      e1 fail     steps: S0 "click('c')" progress .5 | S2 loop -1 | S2 loop -1, invalid   (.5 in 3 steps)
    task B  v2.gomail-1       run r1  seed 1  policy v0   (2 attempts that tie exactly)
      e3, e4 fail steps: SB progress .25 | SB2 0        outputs differ
    task C  miniwob.click-c   run r2  seed 7  policy v1   (one clean attempt + one errored)
      e5 fail  step: SC progress .5
      e6 error step: SC progress 0 ("browser crashed")

With weights progress=1, loop=.5, success=2 (others 0) the shaped returns are
e0 = .5 + (.5 + 2) = 3, e1 = .5 - .5 - .5 = -.5, e2 = .5, e3 = e4 = .25, e5 = .5.
"""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

from halo_data import ids, prompts
from halo_data.config import ViewParams
from halo_data.lake import Lake
from halo_data.writer import EpisodeWriter, append_rows

WEIGHTS = {"w_progress": 1.0, "w_novelty": 0.0, "w_loop": 0.5, "w_validity": 0.0, "w_success": 2.0}


def observation(name: str) -> str:
    return f"RootWebArea 'page {name}'\n\t[12] button '{name}'"


def prompt_for(state: str) -> str:
    return prompts.dumps(prompts.render_messages("do the task", f"http://site/{state}", observation(state)))


def step(state: str, output: str, *, progress: float = 0.0, cumulative: float = 0.0, loop: float = 0.0,
         success: float = 0.0, valid: bool = True) -> dict:
    url = f"http://site/{state}"
    return {
        "url": url,
        "goal": "do the task",
        "observation": observation(state),
        "prompt": prompt_for(state),
        "prompt_version": prompts.PROMPT_VERSION,
        "model_output": output,
        "action": output if valid else None,
        "action_valid": valid,
        "r_progress": progress,
        "r_loop": loop,
        "r_success": success,
        "cumulative_progress": cumulative,
        "state_hash": ids.state_hash(url, observation(state)),
    }


def episode(run_id: str, task_id: str, attempt: int, *, env="miniwob", site="miniwob", seed=1, policy_version="v0",
            mode="random", success=False, error=None) -> dict:
    return {
        "run_id": run_id, "env": env, "task_id": task_id, "site": site, "task_seed": seed, "attempt_idx": attempt,
        "policy_version": policy_version, "mode": mode, "split": "train", "success": success,
        "task_reward": 1.0 if success else 0.0, "terminated": success or error is None, "truncated": False,
        "error": error,
    }


def build(root, episodes) -> Lake:
    lake = Lake.init(root)
    with EpisodeWriter(lake, flush_episodes=100) as writer:
        for fields, steps in episodes:
            writer.write_episode(fields, steps)
    return lake


A, B, C = "miniwob.click-a", "v2.gomail-1", "miniwob.click-c"
EP = {
    "e0": ids.episode_id("r1", A, 1, 0),
    "e1": ids.episode_id("r1", A, 1, 1),
    "e2": ids.episode_id("r1", A, 1, 2),
    "e3": ids.episode_id("r1", B, 1, 0),
    "e4": ids.episode_id("r1", B, 1, 1),
    "e5": ids.episode_id("r2", C, 7, 0),
    "e6": ids.episode_id("r2", C, 7, 1),
}
NAME = {v: k for k, v in EP.items()}


def main_episodes():
    return [
        (episode("r1", A, 0, success=True), [
            step("S0", "click('a')", progress=0.5, cumulative=0.5),
            step("S1", "click('b')", progress=0.5, cumulative=1.0, success=1.0),
        ]),
        (episode("r1", A, 1), [
            step("S0", "click('c')", progress=0.5, cumulative=0.5),
            step("S2", "click('d')", loop=-1.0, cumulative=0.5),
            step("S2", "click('d')", loop=-1.0, cumulative=0.5, valid=False),
        ]),
        (episode("r1", A, 2), [step("S0", "click('c')", progress=0.5, cumulative=0.5)]),
        (episode("r1", B, 0, env="real", site="gomail"), [
            step("SB", "click('x')", progress=0.25, cumulative=0.25),
            step("SB2", "click('y')", cumulative=0.25),
        ]),
        (episode("r1", B, 1, env="real", site="gomail"), [
            step("SB", "click('y')", progress=0.25, cumulative=0.25),
            step("SB2", "click('x')", cumulative=0.25),
        ]),
        (episode("r2", C, 0, seed=7, policy_version="v1", mode="model"), [
            step("SC", "click('p')", progress=0.5, cumulative=0.5),
        ]),
        (episode("r2", C, 1, seed=7, policy_version="v1", mode="model", error="browser crashed"), [
            step("SC", "click('q')", cumulative=0.0),
        ]),
    ]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return build(tmp_path_factory.mktemp("views") / "lake", main_episodes())


def rows(lake: Lake, sql: str, **params) -> list[dict]:
    con = lake.connect(params={**WEIGHTS, **params})
    try:
        return con.sql(sql).to_arrow_table().to_pylist()
    finally:
        con.close()


# ---------------------------------------------------------------------- episodes
def test_episodes_one_row_per_episode_with_components_and_shaped_return(lake):
    got = rows(lake, "select episode_id, task_id, n_steps, n_step_rows, n_valid_actions, n_invalid_actions, "
                     "final_progress, r_progress, r_loop, r_success, shaped_return, success, error from episodes")
    by_name = {NAME[r.pop("episode_id")]: r for r in got}
    assert by_name == {
        "e0": dict(task_id=A, n_steps=2, n_step_rows=2, n_valid_actions=2, n_invalid_actions=0, final_progress=1.0,
                   r_progress=1.0, r_loop=0.0, r_success=1.0, shaped_return=3.0, success=True, error=None),
        "e1": dict(task_id=A, n_steps=3, n_step_rows=3, n_valid_actions=2, n_invalid_actions=1, final_progress=0.5,
                   r_progress=0.5, r_loop=-2.0, r_success=0.0, shaped_return=-0.5, success=False, error=None),
        "e2": dict(task_id=A, n_steps=1, n_step_rows=1, n_valid_actions=1, n_invalid_actions=0, final_progress=0.5,
                   r_progress=0.5, r_loop=0.0, r_success=0.0, shaped_return=0.5, success=False, error=None),
        "e3": dict(task_id=B, n_steps=2, n_step_rows=2, n_valid_actions=2, n_invalid_actions=0, final_progress=0.25,
                   r_progress=0.25, r_loop=0.0, r_success=0.0, shaped_return=0.25, success=False, error=None),
        "e4": dict(task_id=B, n_steps=2, n_step_rows=2, n_valid_actions=2, n_invalid_actions=0, final_progress=0.25,
                   r_progress=0.25, r_loop=0.0, r_success=0.0, shaped_return=0.25, success=False, error=None),
        "e5": dict(task_id=C, n_steps=1, n_step_rows=1, n_valid_actions=1, n_invalid_actions=0, final_progress=0.5,
                   r_progress=0.5, r_loop=0.0, r_success=0.0, shaped_return=0.5, success=False, error=None),
        "e6": dict(task_id=C, n_steps=1, n_step_rows=1, n_valid_actions=1, n_invalid_actions=0, final_progress=0.0,
                   r_progress=0.0, r_loop=0.0, r_success=0.0, shaped_return=0.0, success=False,
                   error="browser crashed"),
    }


def test_reweighting_through_view_params_changes_returns_without_new_rows(lake):
    version_before = lake.table("steps").version()
    default = {NAME[r["episode_id"]]: r["shaped_return"] for r in rows(lake, "select * from episodes")}
    no_bonus = {NAME[r["episode_id"]]: r["shaped_return"]
                for r in rows(lake, "select * from episodes", w_success=0.0, w_loop=0.25)}
    assert default["e0"] == 3.0 and no_bonus["e0"] == 1.0
    assert default["e1"] == -0.5 and no_bonus["e1"] == 0.0
    assert no_bonus["e2"] == default["e2"] == 0.5
    # the GRPO signal follows the weights too
    con = lake.connect(params={**WEIGHTS, "w_success": 0.0, "w_loop": 0.25})
    try:
        adv = dict(con.execute("select episode_id, advantage from grpo_groups where level = 'episode' "
                               "and step_idx = 0 and task_id = ?", [A]).fetchall())
    finally:
        con.close()
    mean = (1.0 + 0.0 + 0.5) / 3
    assert {NAME[k]: v for k, v in adv.items()} == pytest.approx({"e0": 1.0 - mean, "e1": -mean, "e2": 0.5 - mean})
    assert lake.table("steps").version() == version_before


def test_step_rewards_shaped_reward_is_the_weighted_sum(lake):
    got = rows(lake, f"select step_idx, shaped_reward from step_rewards where episode_id = '{EP['e1']}' order by 1")
    assert got == [{"step_idx": 0, "shaped_reward": 0.5}, {"step_idx": 1, "shaped_reward": -0.5},
                   {"step_idx": 2, "shaped_reward": -0.5}]


# ---------------------------------------------------------------------- episode_summary
def test_episode_summary(lake):
    got = rows(lake, "select run_id, task_id, attempts, successes, success_rate, mean_shaped_return, "
                     "mean_final_progress, mean_steps, errors from episode_summary order by run_id, task_id")
    assert got == [
        dict(run_id="r1", task_id=A, attempts=3, successes=1, success_rate=pytest.approx(1 / 3),
             mean_shaped_return=pytest.approx(1.0), mean_final_progress=pytest.approx(2 / 3), mean_steps=2.0, errors=0),
        dict(run_id="r1", task_id=B, attempts=2, successes=0, success_rate=0.0, mean_shaped_return=0.25,
             mean_final_progress=0.25, mean_steps=2.0, errors=0),
        dict(run_id="r2", task_id=C, attempts=2, successes=0, success_rate=0.0, mean_shaped_return=0.25,
             mean_final_progress=0.25, mean_steps=1.0, errors=1),
    ]


# ---------------------------------------------------------------------- progress_ranking
def test_progress_ranking_orders_by_success_then_progress_then_fewer_steps_with_ties(lake):
    got = rows(lake, "select episode_id, rank, task_episodes, percentile, in_top_percent from progress_ranking")
    assert {NAME[r.pop("episode_id")]: r for r in got} == {
        "e0": dict(rank=1, task_episodes=3, percentile=1.0, in_top_percent=True),
        "e2": dict(rank=2, task_episodes=3, percentile=0.5, in_top_percent=True),   # same progress as e1, fewer steps
        "e1": dict(rank=3, task_episodes=3, percentile=0.0, in_top_percent=False),
        "e3": dict(rank=1, task_episodes=2, percentile=1.0, in_top_percent=True),   # exact tie: both rank 1
        "e4": dict(rank=1, task_episodes=2, percentile=1.0, in_top_percent=True),
        "e5": dict(rank=1, task_episodes=2, percentile=1.0, in_top_percent=True),
        "e6": dict(rank=2, task_episodes=2, percentile=0.0, in_top_percent=False),
    }


@pytest.mark.parametrize("top_percent, expected", [
    (100.0, {"e0", "e1", "e2", "e3", "e4", "e5", "e6"}),
    (50.0, {"e0", "e2", "e3", "e4", "e5"}),     # ceil(3 * .5) = 2 of task A; ties at the cut stay in
    (1.0, {"e0", "e3", "e4", "e5"}),            # at least the best of every task
])
def test_progress_ranking_top_percent_cut(lake, top_percent, expected):
    got = rows(lake, "select episode_id from progress_ranking where in_top_percent", top_percent=top_percent)
    assert {NAME[r["episode_id"]] for r in got} == expected


# ---------------------------------------------------------------------- bc_rows
def test_bc_rows_top_percent_valid_actions_no_errored_episodes(lake):
    got = rows(lake, "select episode_id, step_idx, completion, prompt from bc_rows order by all", top_percent=50.0)
    assert sorted((NAME[r["episode_id"]], r["step_idx"], r["completion"]) for r in got) == [
        ("e0", 0, "click('a')"), ("e0", 1, "click('b')"), ("e2", 0, "click('c')"),
        ("e3", 0, "click('x')"), ("e3", 1, "click('y')"), ("e4", 0, "click('y')"), ("e4", 1, "click('x')"),
        ("e5", 0, "click('p')"),
    ]
    assert json.loads(got[0]["prompt"])[0]["role"] == "system"
    everything = rows(lake, "select episode_id, step_idx from bc_rows", top_percent=100.0)
    # e1's invalid step 2 and the errored e6 never become BC rows
    assert sorted((NAME[r["episode_id"]], r["step_idx"]) for r in everything) == [
        ("e0", 0), ("e0", 1), ("e1", 0), ("e1", 1), ("e2", 0), ("e3", 0), ("e3", 1), ("e4", 0), ("e4", 1), ("e5", 0)]


# ---------------------------------------------------------------------- dpo_pairs
def test_dpo_pairs_best_vs_worst(lake):
    got = rows(lake, "select * from dpo_pairs")
    # S0 of task A: e0 (rank 1) against e1 (rank 3); tied task B gives none; single-step prompts give none;
    # task C's other attempt errored, so no pair.
    assert [(r["source"], r["task_id"], NAME[r["chosen_episode_id"]], NAME[r["rejected_episode_id"]], r["chosen"],
             r["rejected"], r["chosen_score"], r["rejected_score"], r["score_margin"]) for r in got] == [
        ("episodes", A, "e0", "e1", "click('a')", "click('c')", 1.0, 0.0, 1.0)]
    assert got[0]["prompt"] == prompt_for("S0")
    assert got[0]["prompt_hash"] == ids.sha256_hex(prompt_for("S0"))


def test_dpo_pairs_all(lake):
    got = rows(lake, "select chosen_episode_id, rejected_episode_id, chosen, rejected from dpo_pairs",
               dpo_pairing="all")
    # e2 vs e1 is no pair: same output
    assert sorted((NAME[r["chosen_episode_id"]], NAME[r["rejected_episode_id"]], r["chosen"], r["rejected"])
                  for r in got) == [("e0", "e1", "click('a')", "click('c')"), ("e0", "e2", "click('a')", "click('c')")]


def test_dpo_pairs_worst_is_the_worst_whose_output_differs(tmp_path):
    t = "miniwob.pair"
    lake = build(tmp_path / "lake", [
        (episode("r", t, 0, success=True), [step("S", "click('x')", cumulative=1.0)]),
        (episode("r", t, 1), [step("S", "click('y')", cumulative=0.5)]),
        (episode("r", t, 2), [step("S", "click('x')", cumulative=0.0)]),   # worst, but says what the best said
    ])
    got = rows(lake, "select chosen_episode_id, rejected_episode_id, chosen_score, rejected_score from dpo_pairs")
    assert got == [dict(chosen_episode_id=ids.episode_id("r", t, 1, 0), rejected_episode_id=ids.episode_id("r", t, 1, 1),
                        chosen_score=1.0, rejected_score=0.5)]


def test_dpo_pairs_pair_across_the_lake_unless_the_scope_is_the_run(tmp_path):
    t = "miniwob.pair"
    lake = build(tmp_path / "lake", [
        (episode("a", t, 0, success=True), [step("S", "click('x')", cumulative=1.0)]),
        (episode("a", t, 1), [step("S", "click('y')", cumulative=0.5)]),
        (episode("b", t, 0), [step("S", "click('z')", cumulative=0.0)]),   # the lake's worst at S
        (episode("b", t, 1), [step("S", "click('x')", cumulative=0.8)]),
    ])
    sql = "select run_id, chosen_episode_id, rejected_episode_id from dpo_pairs order by all"
    name = {ids.episode_id(r, t, 1, i): f"{r}{i}" for r in "ab" for i in (0, 1)}

    def pairs(**params):
        return [(r["run_id"], name[r["chosen_episode_id"]], name[r["rejected_episode_id"]]) for r in rows(lake, sql, **params)]

    assert pairs() == [("a", "a0", "b0")]  # one pair per prompt over the lake: run b's own pair is taken over
    assert pairs(dpo_scope="run") == [("a", "a0", "a1"), ("b", "b1", "b0")]
    assert sorted(pairs(dpo_pairing="all", dpo_scope="run")) == [("a", "a0", "a1"), ("b", "b1", "b0")]
    with pytest.raises(ValueError, match="dpo_scope must be lake or run"):
        ViewParams(dpo_scope="task")


def test_dpo_pairs_from_candidates(tmp_path):
    lake = build(tmp_path / "lake", [])
    eid = ids.episode_id("r", A, 1, 0)
    p = prompt_for("S0")
    append_rows(lake, "candidates", [
        dict(run_id="r", env="miniwob", episode_id=eid, task_id=A, step_idx=0, state_hash="h", candidate_idx=i,
             prompt=p, prompt_hash=ids.sha256_hex(p), model_output=out, score=score, score_source="critic")
        for i, (out, score) in enumerate([("click('a')", 0.9), ("click('z')", 0.1), ("click('y')", 0.5),
                                          ("click('a')", 0.2)])
    ])
    best = rows(lake, "select source, chosen, rejected, chosen_score, rejected_score from dpo_pairs")
    assert best == [dict(source="candidates", chosen="click('a')", rejected="click('z')", chosen_score=0.9,
                         rejected_score=0.1)]
    every = rows(lake, "select chosen, rejected, score_margin from dpo_pairs", dpo_pairing="all")
    assert sorted((r["chosen"], r["rejected"], round(r["score_margin"], 9)) for r in every) == [
        ("click('a')", "click('y')", 0.4), ("click('a')", "click('z')", 0.1), ("click('a')", "click('z')", 0.8),
        ("click('y')", "click('a')", 0.3), ("click('y')", "click('z')", 0.4)]


# ---------------------------------------------------------------------- grpo_groups
def grpo(lake, level, **params):
    got = rows(lake, f"select * from grpo_groups where level = '{level}' order by episode_id, step_idx", **params)
    return {(NAME[r["episode_id"]], r["step_idx"]): r for r in got}


def test_grpo_episode_level_groups_advantages_and_zero_std(lake):
    g = grpo(lake, "episode")
    # the errored e6 is in no group
    assert sorted(g) == [("e0", 0), ("e0", 1), ("e1", 0), ("e1", 1), ("e1", 2), ("e2", 0), ("e3", 0), ("e3", 1),
                         ("e4", 0), ("e4", 1), ("e5", 0)]
    a = g["e0", 0]
    assert a["group_key"] == f"{A}|1|v0"
    assert a["group_size"] == 3 and a["zero_std"] is False
    assert a["reward"] == 3.0 and a["group_mean"] == 1.0
    assert a["group_std"] == pytest.approx(math.sqrt(((3 - 1) ** 2 + (-0.5 - 1) ** 2 + (0.5 - 1) ** 2) / 2))
    assert {k: r["advantage"] for k, r in g.items() if k[0] in ("e0", "e1", "e2")} == {
        ("e0", 0): 2.0, ("e0", 1): 2.0, ("e1", 0): -1.5, ("e1", 1): -1.5, ("e1", 2): -1.5, ("e2", 0): -0.5}
    # all-equal rewards: zero_std, no advantage
    for k in [("e3", 0), ("e3", 1), ("e4", 0), ("e4", 1)]:
        assert (g[k]["group_size"], g[k]["zero_std"], g[k]["group_std"], g[k]["advantage"]) == (2, True, 0.0, 0.0)
    # a single clean attempt: a group of one
    assert (g["e5", 0]["group_size"], g["e5", 0]["zero_std"], g["e5", 0]["advantage"]) == (1, True, 0.0)
    assert g["e0", 1]["completion"] == "click('b')" and g["e0", 1]["prompt"] == prompt_for("S1")
    assert g["e0", 0]["member_id"] == EP["e0"]


def test_grpo_groups_span_runs_unless_the_scope_is_the_run(tmp_path):
    """Two online runs name their versions alike ('1'): by default one group holds both runs' attempts at a task
    seed; group_scope=run keeps each run's own."""
    t = "miniwob.group"
    lake = build(tmp_path / "lake", [
        (episode(run, t, i, policy_version="1", success=ok), [step("S", "click('x')", success=1.0 if ok else 0.0)])
        for run, i, ok in (("a", 0, True), ("a", 1, False), ("b", 0, True), ("b", 1, True))
    ])
    sql = "select g.run_id, attempt_idx, group_key, group_size, zero_std, advantage from grpo_groups g join episodes " \
          "using (episode_id) where level = 'episode' order by g.run_id, attempt_idx"
    lake_wide = rows(lake, sql)
    assert {r["group_key"] for r in lake_wide} == {f"{t}|1|1"} and {r["group_size"] for r in lake_wide} == {4}
    assert [r["advantage"] > 0 for r in lake_wide] == [True, False, True, True]  # b's successes move a's mean
    per_run = rows(lake, sql, group_scope="run")
    assert [(r["run_id"], r["group_key"], r["group_size"], r["zero_std"]) for r in per_run] == [
        ("a", f"{t}|1|1|a", 2, False), ("a", f"{t}|1|1|a", 2, False), ("b", f"{t}|1|1|b", 2, True), ("b", f"{t}|1|1|b", 2, True)]
    assert [r["advantage"] for r in per_run] == [pytest.approx(-per_run[1]["advantage"]), per_run[1]["advantage"], 0.0, 0.0]
    with pytest.raises(ValueError, match="group_scope must be lake or run"):
        ViewParams(group_scope="task")


def test_grpo_step_level_anchor_states_shared_across_attempts(lake):
    gamma, omega = 0.5, 0.5
    s = grpo(lake, "step", gamma=gamma, omega=omega)
    # discounted returns by hand: e0 [.5, 2.5], e1 [.5, -.5, -.5], e2 [.5]
    returns = {("e0", 0): 0.5 + gamma * 2.5, ("e0", 1): 2.5,
               ("e1", 0): 0.5 + gamma * (-0.5 + gamma * -0.5), ("e1", 1): -0.5 + gamma * -0.5, ("e1", 2): -0.5,
               ("e2", 0): 0.5}
    for k, v in returns.items():
        assert s[k]["reward"] == pytest.approx(v), k
    s0_mean = (returns["e0", 0] + returns["e1", 0] + returns["e2", 0]) / 3
    s2_mean = (returns["e1", 1] + returns["e1", 2]) / 2
    # S0 is one anchor across three attempts; S2 is one anchor visited twice in e1; S1 is seen once
    for k in [("e0", 0), ("e1", 0), ("e2", 0)]:
        assert s[k]["group_size"] == 3 and s[k]["zero_std"] is False
        assert s[k]["group_mean"] == pytest.approx(s0_mean)
        assert s[k]["advantage"] == pytest.approx(returns[k] - s0_mean)
        assert s[k]["group_key"] == f"{A}|1|v0|{ids.state_hash('http://site/S0', observation('S0'))}"
    assert (s["e0", 1]["group_size"], s["e0", 1]["zero_std"], s["e0", 1]["advantage"]) == (1, True, 0.0)
    assert s["e1", 1]["group_size"] == 2 and s["e1", 1]["advantage"] == pytest.approx(returns["e1", 1] - s2_mean)
    assert s["e1", 2]["advantage"] == pytest.approx(returns["e1", 2] - s2_mean)
    assert s["e1", 1]["member_id"] == f"{EP['e1']}:1"
    # combined advantage A = A_episode + omega * A_step, the same on both levels
    e = grpo(lake, "episode", gamma=gamma, omega=omega)
    episode_adv = {"e0": 2.0, "e1": -1.5, "e2": -0.5}
    for k, r in s.items():
        if k[0] in episode_adv:
            want = episode_adv[k[0]] + omega * r["advantage"]
            assert r["combined_advantage"] == pytest.approx(want), k
            assert e[k]["combined_advantage"] == pytest.approx(want), k
    # omega = 0 leaves the episode advantage alone; gamma = 0 makes returns the step's own reward
    flat = grpo(lake, "step", gamma=0.0, omega=0.0)
    assert flat["e0", 0]["reward"] == 0.5 and flat["e0", 0]["combined_advantage"] == 2.0


def test_grpo_steps_without_state_hash_are_not_grouped(tmp_path):
    t = "miniwob.nostate"
    s0 = {**step("S", "click('a')", progress=1.0), "state_hash": None}
    s1 = {**step("T", "click('b')"), "state_hash": None}
    lake = build(tmp_path / "lake", [(episode("r", t, 0), [s0, s1]), (episode("r", t, 1), [{**s0, "r_progress": 0.0}])])
    got = rows(lake, "select group_size from grpo_groups where level = 'step'")
    assert [r["group_size"] for r in got] == [1, 1, 1]


def test_grpo_zero_std_group_advantages_are_exactly_zero(tmp_path):
    # three returns of 0.1: their float mean is 0.10000000000000002, and reward - mean would be -1.4e-17
    t = "miniwob.tenth"
    lake = build(tmp_path / "lake", [(episode("r", t, a), [step("S", f"click('{a}')", progress=0.1)]) for a in range(3)])
    got = rows(lake, "select level, reward, group_size, zero_std, advantage, combined_advantage from grpo_groups "
                     "order by level, member_id")
    zero = dict(reward=0.1, group_size=3, zero_std=True, advantage=0.0, combined_advantage=0.0)
    assert got == [dict(level="episode", **zero)] * 3 + [dict(level="step", **zero)] * 3


# ---------------------------------------------------------------------- reward_stats
def test_reward_stats_per_run_and_per_policy_version(lake):
    got = rows(lake, "select * from reward_stats order by scope, run_id, policy_version")
    r1 = [3.0, -0.5, 0.5, 0.25, 0.25]
    mean = sum(r1) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in r1) / 4)
    expected_r1 = dict(n_episodes=5, n_groups=2, n_trainable_groups=1, frac_reward_zero_std=0.5,
                       success_rate=0.2, reward_mean=pytest.approx(mean), reward_std=pytest.approx(std))
    expected_r2 = dict(n_episodes=1, n_groups=1, n_trainable_groups=0, frac_reward_zero_std=1.0,
                       success_rate=0.0, reward_mean=0.5, reward_std=0.0)
    assert got == [
        dict(scope="policy_version", run_id=None, policy_version="v0", **expected_r1),
        dict(scope="policy_version", run_id=None, policy_version="v1", **expected_r2),
        dict(scope="run", run_id="r1", policy_version="v0", **expected_r1),
        dict(scope="run", run_id="r2", policy_version="v1", **expected_r2),
    ]


# ---------------------------------------------------------------------- eval_matrix
def test_eval_matrix_per_mode_and_site(lake):
    got = rows(lake, "select * exclude (mean_model_calls, mean_prompt_tokens, mean_completion_tokens, mean_cost_usd, "
                     "manager_call_rate, cache_hit_rate) from eval_matrix order by mode, site")
    assert got == [
        dict(mode="model", site="miniwob", split="train", n_episodes=2, n_tasks=1, success_rate=0.0,
             mean_task_reward=0.0, mean_shaped_return=0.25, median_steps=1.0, error_rate=0.5),
        dict(mode="random", site="gomail", split="train", n_episodes=2, n_tasks=1, success_rate=0.0,
             mean_task_reward=0.0, mean_shaped_return=0.25, median_steps=2.0, error_rate=0.0),
        dict(mode="random", site="miniwob", split="train", n_episodes=3, n_tasks=1, success_rate=pytest.approx(1 / 3),
             mean_task_reward=pytest.approx(1 / 3), mean_shaped_return=pytest.approx(1.0), median_steps=2.0,
             error_rate=0.0),
    ]


# ---------------------------------------------------------------------- screenshots
def test_screenshots_view_hides_copies(tmp_path):
    lake = build(tmp_path / "lake", [])
    shot = {"hash_prefix": "a", "hash": "a" * 64, "image": b"\x89PNG one", "format": "png", "width": 2, "height": 1}
    other = {**shot, "hash_prefix": "b", "hash": "b" * 64, "image": b"\x89PNG two"}
    # two writers stored the same image at once: two commits, the same hash
    lake.append("screenshots", pa.Table.from_pylist([shot, other]))
    lake.append("screenshots", pa.Table.from_pylist([shot]))
    assert rows(lake, "select count(*) as n from screenshots_all") == [{"n": 3}]
    assert rows(lake, "select hash, image, width, height from screenshots order by hash") == [
        {"hash": "a" * 64, "image": b"\x89PNG one", "width": 2, "height": 1},
        {"hash": "b" * 64, "image": b"\x89PNG two", "width": 2, "height": 1}]


def test_every_view_reads_an_empty_lake(tmp_path):
    from halo_data.views import view_names

    lake = build(tmp_path / "lake", [])
    for name in view_names():
        assert rows(lake, f"select count(*) as n from {name}") == [{"n": 0}], name


def test_view_columns_have_no_hugeint_or_decimal(lake):
    # sum() of integers is a HUGEINT in DuckDB, which Arrow and JSON see as a decimal: counts are BIGINT
    from halo_data.views import view_names

    con = lake.connect()
    try:
        odd = [(name, column, kind) for name in view_names()
               for column, kind, *_ in con.execute(f"describe {name}").fetchall()
               if kind in ("HUGEINT", "UHUGEINT") or kind.startswith("DECIMAL")]
    finally:
        con.close()
    assert odd == []


def test_view_aggregates_give_the_same_digits_on_every_run(tmp_path):
    # Many small commits: a group's rows sit in many files, which parallel threads aggregate in any order.
    from halo_data.synthetic import SyntheticSpec, build_synthetic_lake

    spec = SyntheticSpec(n_steps=3000, attempts_per_task=4, min_steps=5, max_steps=15, screenshots=False, seed=1)
    lake = build_synthetic_lake(str(tmp_path / "lake"), spec, batch_steps=60)
    queries = ["select * from episodes order by episode_id", "select * from episode_summary order by all",
               "select * from reward_stats order by all", "select * from eval_matrix order by all",
               "select * exclude (prompt) from grpo_groups order by level, episode_id, step_idx"]
    for sql in queries:
        results = []
        for _ in range(3):
            con = lake.connect()
            try:
                con.execute("SET threads = 4")
                results.append(con.sql(sql).to_arrow_table())
            finally:
                con.close()
        assert results[0].num_rows > 0, sql
        assert all(r.equals(results[0]) for r in results[1:]), sql


def test_dpo_pairs_default_pairing_equals_the_brute_force_rule_on_random_steps():
    """The default pair per prompt (found without pairing every step with every other) is the one the rule names:
    over every ordered pair of differing outputs, the best chosen rank, then the worst rejected rank, then the
    lower episode ids and step indexes; in each scope. Random prompts, outputs and tied ranks, on DuckDB."""
    import random

    import duckdb

    from halo_data.views import get_view

    con = duckdb.connect()
    con.execute("CREATE TABLE candidates (run_id VARCHAR, task_id VARCHAR, prompt_hash VARCHAR, prompt VARCHAR, "
                "model_output VARCHAR, episode_id VARCHAR, step_idx INTEGER, score DOUBLE, candidate_idx INTEGER)")
    con.execute("CREATE TABLE mcts_pairs (source VARCHAR, run_id VARCHAR, task_id VARCHAR, prompt_hash VARCHAR, "
                "prompt VARCHAR, chosen VARCHAR, rejected VARCHAR, tree_id VARCHAR, parent_id VARCHAR, step_idx INTEGER, "
                "chosen_q DOUBLE, rejected_q DOUBLE, chosen_logprob_sum DOUBLE, rejected_logprob_sum DOUBLE, "
                "chosen_node_id VARCHAR, rejected_node_id VARCHAR)")
    rng = random.Random(7)
    checked = 0
    for case in range(60):
        episodes = [(f"e{i:02d}", rng.choice("ab"), rng.randint(1, 4)) for i in range(rng.randint(2, 12))]  # id, run, rank
        steps = [(run, "t", rng.choice(["p", "q"]), rng.choice(["x", "y", "z"]), ep, k, None, "prompt")
                 for ep, run, _ in episodes for k in range(rng.randint(1, 3))]
        con.execute("CREATE OR REPLACE TABLE steps (run_id VARCHAR, task_id VARCHAR, prompt_hash VARCHAR, "
                    "model_output VARCHAR, episode_id VARCHAR, step_idx INTEGER, action_source VARCHAR, prompt VARCHAR)")
        con.executemany("INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?)", steps)
        con.execute("CREATE OR REPLACE TABLE progress_ranking (episode_id VARCHAR, rank BIGINT, percentile DOUBLE, error VARCHAR)")
        con.executemany("INSERT INTO progress_ranking VALUES (?, ?, ?, NULL)", [(e, r, 1.0 / r) for e, _, r in episodes])
        rank = {e: r for e, _, r in episodes}
        con.execute(f"CREATE OR REPLACE VIEW dpo_pairs AS {get_view('dpo_pairs').sql}")
        for scope in ("lake", "run"):
            con.execute("SET VARIABLE halo_dpo_pairing = 'best_vs_worst'")
            con.execute(f"SET VARIABLE halo_dpo_scope = '{scope}'")
            got = sorted(con.execute("SELECT run_id, prompt_hash, chosen_episode_id, chosen_step_idx, rejected_episode_id, "
                                     "rejected_step_idx FROM dpo_pairs").fetchall())
            best: dict[tuple, tuple] = {}
            for c in steps:
                for r in steps:
                    if c[2] != r[2] or rank[c[4]] >= rank[r[4]] or c[3] == r[3] or (scope == "run" and c[0] != r[0]):
                        continue
                    key = (c[2], c[0] if scope == "run" else None)
                    order = (rank[c[4]], -rank[r[4]], c[4], r[4], c[5], r[5])
                    if key not in best or order < best[key][0]:
                        best[key] = (order, (c[0], c[2], c[4], c[5], r[4], r[5]))
            assert got == sorted(pair for _, pair in best.values()), (case, scope)
            checked += len(got)
    assert checked > 50
