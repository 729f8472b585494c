"""A training job that names its runs computes its view over those runs alone: its rows do not change when
unrelated runs land in the lake, and the read opens only its runs' files."""

from __future__ import annotations

import re

import pytest

from halo_data.lake import Lake
from halo_data.reader import runs_named
from halo_train.config import BCConfig, DPOConfig, GRPOConfig, TrainConfigError
from halo_train.data import read_for
from halo_train.testing import write_fixture_episodes

JOB_RUN = "job-run"


def rows(cfg) -> list[dict]:
    return sorted(read_for(cfg).table.to_pylist(), key=repr)


@pytest.mark.parametrize("config", [BCConfig, DPOConfig, GRPOConfig])
def test_a_jobs_rows_are_the_same_with_and_without_unrelated_runs_in_the_lake(tmp_path, config):
    lake = Lake.init(tmp_path / "lake")
    write_fixture_episodes(lake, run_id=JOB_RUN)
    common = dict(lake=str(tmp_path / "lake"), base_model="unused", params={"top_percent": 100})
    named = config(**common, where=f"run_id = '{JOB_RUN}'")
    listed = config(**common, runs=[JOB_RUN])
    lake_wide = config(**common, where=f"run_id = '{JOB_RUN}'", scope="lake")
    alone = rows(named)
    assert alone and rows(listed) == alone and rows(lake_wide) == alone

    # Another run on the same tasks and seeds, with other outcomes (three steps per episode, six attempts).
    write_fixture_episodes(lake, run_id="unrelated", attempts=6, n_steps=3)
    assert rows(named) == alone and rows(listed) == alone
    # Lake-wide, the other run's episodes join the rankings, pairs and groups the job's rows come from.
    assert rows(lake_wide) != alone


def test_a_run_scoped_read_lists_only_that_runs_files(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    for run in ("run-a", "run-b", "run-c"):
        write_fixture_episodes(lake, run_id=run)
    con = lake.connect(runs=["run-b"])
    try:
        steps_sql = con.sql("select sql from duckdb_views() where view_name = 'steps'").fetchall()[0][0]
        runs_seen = con.sql("select distinct run_id from grpo_groups").fetchall()
    finally:
        con.close()
    listed = set(re.findall(r"'([^']+\.parquet)'", steps_sql))
    runs_in = {path: {r["run_id"] for r in lake.query_arrow(f"select distinct run_id from read_parquet('{path}')",
                                                          views=False, tables=()).to_pylist()}
               for path in lake.files("steps")}
    assert listed == {path for path, held in runs_in.items() if held == {"run-b"}} and listed
    assert runs_seen == [("run-b",)]


@pytest.mark.parametrize("where, runs", [
    ("run_id = 'a'", ["a"]),
    ("run_id = 'a' and level = 'episode'", ["a"]),
    ("run_id in ('a', 'b') and task_id like 'x%'", ["a", "b"]),
    ("run_id in ('a', 'b') and run_id = 'b'", ["b"]),
    ("run_id = 'a' or task_id = 'x'", None),  # OR does not pin the rows to a run
    ("not run_id = 'a'", None),
    ("task_id like 'miniwob.%'", None),
    (None, None),
])
def test_the_runs_a_filter_pins(where, runs):
    assert runs_named(where) == runs


def test_runs_and_a_lake_scope_contradict(tmp_path):
    with pytest.raises(TrainConfigError, match="--runs"):
        GRPOConfig(lake=str(tmp_path / "lake"), base_model="unused", runs=["a"], scope="lake")


@pytest.mark.parametrize("config", [BCConfig, DPOConfig, GRPOConfig])
def test_a_jobs_rows_come_in_one_order_whatever_order_the_lake_holds_them_in(tmp_path, config):
    """The same rows in one order, however the scan meets them: a job's batches (its seeded shuffle of that order),
    a resumed job's remaining steps and a training seed's adapter all follow it."""
    reads = []
    for order in (("a", "b", "c"), ("c", "b", "a")):
        lake = Lake.init(tmp_path / "-".join(order))
        for run in order:
            write_fixture_episodes(lake, run_id=run)
        cfg = config(lake=str(tmp_path / "-".join(order)), base_model="unused", params={"top_percent": 100},
                     where="run_id IN ('a', 'b', 'c')")
        reads.append([read_for(cfg).table.to_pylist() for _ in range(3)])
    first = reads[0][0]
    assert len({r["run_id"] for r in first}) == 3 and all(read == first for rs in reads for read in rs)
