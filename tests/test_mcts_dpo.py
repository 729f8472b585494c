"""halo-train dpo --source mcts on a real lake of search-tree nodes: stored generation logprobs are the reference."""

from __future__ import annotations

import pytest

from halo_data.lake import Lake
from halo_data.runs import RunRecord, upsert_runs
from halo_data.writer import append_rows
from test_mcts_views import node

pytestmark = pytest.mark.slow


def test_dpo_on_mcts_pairs_uses_stored_logprobs_as_the_reference(tmp_path):
    from halo_train import DPOConfig, train_dpo
    from halo_train.tiny_model import build_tiny_model

    lake = Lake.init(tmp_path / "lake")
    upsert_runs(lake, [RunRecord(run_id="s1", kind="rollout", mode="mcts", config={"search": {"theta": 0.1}})])
    append_rows(lake, "mcts_nodes", [
        node("s1", "t1", "0", visits=3),
        node("s1", "t1", "0.0", action="click('A')", q=0.9, logprob=-1.0),
        node("s1", "t1", "0.1", action="click('B')", q=0.2, logprob=-2.0),
        node("s1", "t2", "0", visits=3),
        node("s1", "t2", "0.0", action="click('C')", q=0.9),  # no stored logprobs: the base model is the reference
        node("s1", "t2", "0.1", action="click('D')", q=0.2),
    ])
    model = build_tiny_model(tmp_path / "tiny")
    beta = 0.1
    result = train_dpo(DPOConfig(lake=str(tmp_path / "lake"), base_model=str(model), output_dir=str(tmp_path / "out"),
                                 max_steps=2, lr=1e-3, batch_size=1, lora_r=4, lora_alpha=8, beta=beta, source="mcts"))
    assert result.rows == 2
    got = lake.query_arrow(f"select step, metric, value from train_metrics where run_id = '{result.run_id}'").to_pylist()
    steps = {}
    for r in got:
        steps.setdefault(r["step"], {})[r["metric"]] = r["value"]
    stored = [m for m in steps.values() if "rewards/chosen" in m
              and m["rewards/chosen"] == pytest.approx(beta * (m["logps/chosen"] + 1.0), abs=1e-4)
              and m["rewards/rejected"] == pytest.approx(beta * (m["logps/rejected"] + 2.0), abs=1e-4)]
    assert len(stored) == 1  # the t1 pair: reward = beta * (logp - stored logp)
    # the other pair's reference is the base model, which the zero-initialised adapter still equals at its step
    assert any(abs(m.get("rewards/chosen", 1.0)) < 0.05 for m in steps.values())


def test_source_picks_rows_of_dpo_pairs_only():
    from halo_train.config import DPOConfig, TrainConfigError

    with pytest.raises(TrainConfigError, match="--source picks rows of dpo_pairs; --view bc_rows has no source column"):
        DPOConfig(base_model="org/model", view="bc_rows", source="mcts")
    assert DPOConfig(base_model="org/model", source="mcts", where="task_id = 'x'").where == "(task_id = 'x') AND source = 'mcts'"
