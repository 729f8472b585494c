"""A lake of many runs: what keeps an iteration's cost, the query cold start and the dashboard from growing with it.

The measurements at 100k-5M steps are ``python -m bench lake-growth``; these check the mechanisms at a few runs.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from halo_data import ops
from halo_data.lake import Lake
from halo_data.reader import tables_needed
from halo_data.synthetic import CampaignGenerator, CampaignSpec
from halo_data.writer import Screenshot, screenshots_table


@pytest.fixture(scope="module")
def campaign_lake(tmp_path_factory) -> tuple[Lake, CampaignGenerator]:
    lake = Lake.init(str(tmp_path_factory.mktemp("campaign") / "lake"))
    campaign = CampaignGenerator(CampaignSpec(run_steps=150, attempts_per_task=3, templates=2, screenshot_share=0.05))
    for i in range(4):
        campaign.append_run(lake, i)
    return lake, campaign


def test_a_campaign_adds_one_run_per_iteration_with_its_own_episodes_and_screenshots(campaign_lake):
    lake, campaign = campaign_lake
    per_run = lake.query_arrow(
        """select run_id, count(*) as steps, count(distinct episode_id) as episodes, count(distinct task_id) as tasks,
                  count(screenshot_hash) as with_shot, count(distinct policy_version) as versions
           from steps group by run_id order by run_id""").to_pylist()
    assert [r["run_id"] for r in per_run] == [campaign.run_id(i) for i in range(4)]
    assert all(r["steps"] == 150 and r["tasks"] >= 2 and r["with_shot"] > 0 and r["versions"] == 1 for r in per_run)
    # the same template again (iterations 0 and 2) gives new episode ids and new images
    episodes = lake.query_arrow("select count(distinct episode_id) as n from steps")["n"][0].as_py()
    assert episodes == sum(r["episodes"] for r in per_run)
    missing = lake.query_arrow("""select count(*) as n from steps s where screenshot_hash is not null
                                  and not exists (select 1 from screenshots_all i where i.hash = s.screenshot_hash)""")
    assert missing["n"][0].as_py() == 0
    assert lake.query_arrow("select count(*) as n from screenshots_all")["n"][0].as_py() == \
        lake.query_arrow("select count(distinct screenshot_hash) as n from steps")["n"][0].as_py()
    assert ops.validate(lake) == []
    con = lake.connect(runs=[campaign.run_id(3)])
    try:
        for view in ("grpo_groups", "bc_rows", "dpo_pairs", "state_groups"):
            assert con.sql(f"select distinct run_id from {view}").fetchall() == [(campaign.run_id(3),)], view
    finally:
        con.close()


def test_a_query_registers_only_the_tables_it_and_its_views_read(campaign_lake):
    lake, _ = campaign_lake
    assert tables_needed("select count(*) from steps") == ("steps",)
    assert set(tables_needed("select * from state_groups")) == {"candidates"}
    assert "steps" in tables_needed("select * from grpo_groups") and "screenshots" not in tables_needed("select * from grpo_groups")
    assert "screenshots" in tables_needed("select * from screenshots")
    assert tables_needed("show tables") is None
    assert tables_needed("select table_name from duckdb_columns()") is None
    con = lake.connect(views="select count(*) from steps")
    try:
        registered = {r[0] for r in con.sql("select view_name from duckdb_views() where not internal").fetchall()}
    finally:
        con.close()
    assert registered == {"steps"}
    assert lake.query_arrow("select count(*) as n from steps")["n"][0].as_py() == 600


def test_files_of_one_schema_are_read_without_a_union_of_every_files_columns(campaign_lake, tmp_path):
    lake, _ = campaign_lake
    con = lake.connect(views=False, tables=("steps",))
    try:
        sql = con.sql("select sql from duckdb_views() where view_name = 'steps'").fetchall()[0][0]
    finally:
        con.close()
    assert "union_by_name = false" in sql


def test_compaction_leaves_screenshot_files_that_reached_the_target_alone(tmp_path, monkeypatch):
    def shots(k: int, n: int) -> pa.Table:
        table = screenshots_table([Screenshot.from_bytes(bytes([k, i]) * 500) for i in range(n)])
        return table.set_column(0, "hash_prefix", pa.array(["0"] * table.num_rows))  # one partition

    def lake_with_one_big_and_two_small_files(name: str) -> tuple[Lake, list[str], int]:
        lake = Lake.init(str(tmp_path / name))
        lake.append("screenshots", shots(0, 20))
        big = lake.files("screenshots")
        for k in (1, 2):
            lake.append("screenshots", shots(k, 1))
        size = max(pa.table(lake.table("screenshots").get_add_actions(flatten=True)).column("size_bytes").to_pylist())
        return lake, big, size

    lake, big, size = lake_with_one_big_and_two_small_files("bounded")
    monkeypatch.setitem(ops.COMPACT_TARGET_SIZE, "screenshots", int(size * 0.9))
    assert ops.compact(lake)["tables"]["screenshots"] == {"files_removed": 2, "files_added": 1}
    assert set(big) <= set(lake.files("screenshots"))
    # with a target past the partition's size, the old file is rewritten along with every new one
    lake, big, size = lake_with_one_big_and_two_small_files("whole")
    monkeypatch.setitem(ops.COMPACT_TARGET_SIZE, "screenshots", size * 10)
    assert ops.compact(lake)["tables"]["screenshots"] == {"files_removed": 3, "files_added": 1}
    assert not set(big) & set(lake.files("screenshots"))


def test_the_overview_of_a_lake_of_many_runs_summarises_the_newest(monkeypatch, tmp_path, campaign_lake):
    from test_dashboard import open_app, texts

    lake, campaign = campaign_lake
    monkeypatch.setenv("HALO_DASHBOARD_OVERVIEW_RUNS", "2")
    at = open_app(monkeypatch, lake.root)
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Runs with episodes"] == "4" and metrics["Steps"] == "600"
    newest = {campaign.run_id(3), campaign.run_id(2)}
    assert set(at.dataframe[0].value["run_id"]) == newest
    assert "newest 2 of the lake's 4 runs" in texts(at)


def test_compaction_packs_many_runs_into_a_file_and_run_scoped_reads_still_see_one_run(tmp_path):
    """Steps are partitioned by env alone: compaction merges the runs' files, so a query opens a bounded number of
    files however many runs the lake holds; a run's read lists only the files whose run_id statistics can hold it
    and skips the other runs' rows."""
    lake = Lake.init(str(tmp_path / "lake"))
    campaign = CampaignGenerator(CampaignSpec(run_steps=120, attempts_per_task=2, templates=2, screenshot_share=0.05))
    for i in range(3):
        campaign.append_run(lake, i)
    scoped_sql = "select * from grpo_groups order by episode_id, step_idx, member_id"
    before = {i: lake.query_arrow(scoped_sql, runs=[campaign.run_id(i)]) for i in range(3)}
    assert all(t.num_rows for t in before.values())
    per_run = lake.query_arrow("select run_id, count(*) as steps from steps group by 1 order by 1")
    assert len(lake.files("steps")) >= 3

    ops.compact(lake)

    assert len(lake.files("steps")) == lake.query_arrow("select count(distinct env) from steps").column(0)[0].as_py()
    for i in range(3):
        assert lake.query_arrow(scoped_sql, runs=[campaign.run_id(i)]).equals(before[i])
    counted = ops.steps_per_run(lake)   # compacted files hold several runs: their run_id column is counted
    assert counted.select(["run_id", "steps"]).equals(per_run)
    campaign.append_run(lake, 3)
    new = campaign.run_id(3)
    own = [p for p in lake.files("steps") if
           lake.query_arrow(f"select count(*) from read_parquet('{p}') where run_id <> '{new}'", views=False,
                            tables=()).column(0)[0].as_py() == 0]
    listed = Lake.open(lake.root).table("steps").file_uris(file_pruning_predicate=[("run_id", "in", [new])])
    assert sorted(u.removeprefix("file://") for u in listed) == sorted(own) and own
    assert ops.steps_per_run(lake).to_pylist()[-1] == {"run_id": new, "steps": 120, "files": len(own)}
