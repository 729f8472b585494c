"""mcts_pairs and dpo_pairs' search-tree pairs, from hand-written mcts_nodes rows to exact expected rows."""

from __future__ import annotations

import pytest

from halo_data import ids, prompts
from halo_data.lake import Lake
from halo_data.runs import RunRecord, upsert_runs
from halo_data.writer import append_rows
from test_views import rows  # the views' own query helper (reward weights do not touch these views)

TASK = "miniwob.code-lock"


def prompt_at(node_id: str) -> str:
    return prompts.dumps(prompts.render_messages("Enter the code", "file:///lock.html", f"RootWebArea 'lock {node_id}'"))


def node(run_id: str, tree_id: str, node_id: str, *, action: str | None = None, q: float = 0.0, visits: int = 1,
         logprob: float | None = None, reproducible: bool = True) -> dict:
    parent = node_id.rsplit(".", 1)[0] if "." in node_id else None
    p = prompt_at(node_id)
    return dict(run_id=run_id, env="miniwob", tree_id=tree_id, node_id=node_id, parent_id=parent, task_id=TASK,
                depth=node_id.count("."), action=action, model_output=action, visits=visits, q=q, logprob_sum=logprob,
                prompt=p, prompt_hash=ids.sha256_hex(p), reproducible=reproducible)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    lake = Lake.init(tmp_path_factory.mktemp("mcts") / "lake")
    upsert_runs(lake, [RunRecord(run_id="s1", kind="rollout", mode="mcts", config={"search": {"theta": 0.1}}),
                       RunRecord(run_id="s2", kind="rollout", mode="mcts", config={"search": {"theta": 0.5}})])
    append_rows(lake, "mcts_nodes", [
        node("s1", "t1", "0", visits=6),
        node("s1", "t1", "0.0", action="click('A')", q=0.9, visits=3, logprob=-1.0),
        node("s1", "t1", "0.1", action="click('B')", q=0.5, visits=2, logprob=-2.0),
        node("s1", "t1", "0.2", action="click('C')", q=0.85, visits=1),      # within theta of 0.0: no pair with it
        node("s1", "t1", "0.3", action="click('Clock')", q=0.0, reproducible=False),  # flagged: never paired
        node("s1", "t1", "0.4", action="click('D')", q=0.0, visits=0),        # never tried: its Q says nothing
        node("s1", "t1", "0.0.0", action="click('C')", q=1.0),                # an only child: no sibling
        # a flagged parent: its children's prompt is not trusted
        node("s1", "t2", "0", visits=2, reproducible=False),
        node("s1", "t2", "0.0", action="click('A')", q=1.0),
        node("s1", "t2", "0.1", action="click('B')", q=0.0),
        # run s2 stores theta 0.5: a 0.4 difference is no pair there
        node("s2", "t3", "0", visits=2),
        node("s2", "t3", "0.0", action="click('A')", q=0.9),
        node("s2", "t3", "0.1", action="click('B')", q=0.5),
        node("s2", "t3", "0.2", action="click('C')", q=0.3),
    ])
    return lake


def test_mcts_pairs_siblings_whose_q_differ_by_more_than_the_runs_theta(lake):
    got = rows(lake, "select run_id, tree_id, parent_id, step_idx, chosen, rejected, round(q_margin, 9) as margin, "
                     "chosen_logprob_sum, rejected_logprob_sum, theta, prompt from mcts_pairs order by all")
    assert [{k: v for k, v in r.items() if k != "prompt"} for r in got] == [
        dict(run_id="s1", tree_id="t1", parent_id="0", step_idx=0, chosen="click('A')", rejected="click('B')", margin=0.4,
             chosen_logprob_sum=-1.0, rejected_logprob_sum=-2.0, theta=0.1),
        dict(run_id="s1", tree_id="t1", parent_id="0", step_idx=0, chosen="click('C')", rejected="click('B')", margin=0.35,
             chosen_logprob_sum=None, rejected_logprob_sum=-2.0, theta=0.1),
        dict(run_id="s2", tree_id="t3", parent_id="0", step_idx=0, chosen="click('A')", rejected="click('C')", margin=0.6,
             chosen_logprob_sum=None, rejected_logprob_sum=None, theta=0.5),
    ]
    assert {r["prompt"] for r in got} == {prompt_at("0")}  # the parent's prompt, where the siblings were sampled


def test_dpo_pairs_take_the_best_against_the_worst_sibling_as_source_mcts(lake):
    got = rows(lake, "select source, chosen_episode_id, chosen_step_idx, chosen, rejected, round(score_margin, 9) as margin, "
                     "chosen_logprob_sum from dpo_pairs order by all")
    assert got == [
        dict(source="mcts", chosen_episode_id="t1", chosen_step_idx=0, chosen="click('A')", rejected="click('B')", margin=0.4,
             chosen_logprob_sum=-1.0),
        dict(source="mcts", chosen_episode_id="t3", chosen_step_idx=0, chosen="click('A')", rejected="click('C')", margin=0.6,
             chosen_logprob_sum=None),
    ]
    every = rows(lake, "select chosen, rejected from dpo_pairs where source = 'mcts' order by all", dpo_pairing="all")
    assert [(r["chosen"], r["rejected"]) for r in every] == [
        ("click('A')", "click('B')"), ("click('A')", "click('C')"), ("click('C')", "click('B')")]
