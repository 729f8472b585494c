"""The lake itself: init, format version, older lakes with fewer columns, time travel, ids."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from halo_data import ids
from halo_data import schema as S
from halo_data.config import parse_as_of
from halo_data.lake import INFO_PATH, Lake, LakeError, LakeNotFound, LakeVersionError
from halo_data.writer import EpisodeWriter


def one_episode(run_id="r1", task_id="miniwob.click-button", attempt=0, n_steps=2, **extra) -> tuple[dict, list[dict]]:
    fields = {"run_id": run_id, "env": "miniwob", "task_id": task_id, "task_seed": 3, "attempt_idx": attempt, **extra}
    steps = [{"url": "http://x/", "model_output": f"click('{i}')", "r_progress": 0.5} for i in range(n_steps)]
    return fields, steps


def count(lake: Lake, sql: str, **kw) -> int:
    return lake.query_arrow(sql, **kw).column(0)[0].as_py()


def test_init_creates_every_table_and_info(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    info = json.loads((tmp_path / "lake" / INFO_PATH).read_text())
    assert info["format_version"] == S.FORMAT_VERSION
    assert set(info["tables"]) == set(S.TABLES)
    assert info["tables"]["steps"]["partition_by"] == ["env"]
    assert info["tables"]["screenshots"]["partition_by"] == ["hash_prefix"]
    assert info["tables"]["train_metrics"]["partition_by"] == ["run_id"]
    for name, spec in S.TABLES.items():
        dtab = DeltaTable(str(tmp_path / "lake" / name))
        assert dtab.metadata().partition_columns == list(spec.partition_by), name
        assert pa.schema(dtab.schema().to_arrow()).names == spec.column_names, name
    assert lake.versions() == {name: 0 for name in S.TABLES}


def test_init_is_idempotent(tmp_path):
    root = tmp_path / "lake"
    lake = Lake.init(root)
    lake.append("train_metrics", pa.Table.from_pylist([{"run_id": "t", "step": 1, "metric": "loss", "value": 1.0}]))
    info_before = (root / INFO_PATH).read_text()
    versions_before = lake.versions()
    again = Lake.init(root)
    assert (root / INFO_PATH).read_text() == info_before
    assert again.versions() == versions_before
    assert count(again, "select count(*) from train_metrics") == 1


def test_open_missing_lake_names_the_fix(tmp_path):
    with pytest.raises(LakeNotFound, match=r"no HALO lake at .*nowhere: create one with `halo-data init .*nowhere`"):
        Lake.open(tmp_path / "nowhere")


def test_newer_format_version_is_refused_with_the_fix(tmp_path):
    root = tmp_path / "lake"
    Lake.init(root)
    info = json.loads((root / INFO_PATH).read_text())
    info["format_version"] = S.FORMAT_VERSION + 1
    (root / INFO_PATH).write_text(json.dumps(info))
    with pytest.raises(LakeVersionError) as e:
        Lake.open(root)
    assert str(e.value) == (
        f"lake {root} has format version {S.FORMAT_VERSION + 1}, this HALO reads up to {S.FORMAT_VERSION}: "
        "upgrade HALO (pip install -U halo) to read it"
    )
    with pytest.raises(LakeVersionError):
        Lake.init(root)


def test_corrupt_info_is_a_lake_error(tmp_path):
    root = tmp_path / "lake"
    Lake.init(root)
    (root / INFO_PATH).write_text("{not json")
    with pytest.raises(LakeError, match="is not a HALO lake info file"):
        Lake.open(root)


# Columns an older HALO wrote: a subset of today's steps and runs columns.
OLD_STEPS_COLUMNS = ["run_id", "env", "episode_id", "task_id", "attempt_idx", "task_seed", "success", "step_idx",
                     "url", "prompt", "model_output", "action", "r_progress", "r_success", "reward"]
OLD_RUNS_COLUMNS = ["run_id", "kind", "started_at"]


# Format version 1's layout: the tables of runs' rows partitioned by run as well as env.
V1_PARTITIONS = {name: ["env", "run_id"] if name in ("steps", "candidates", "mcts_nodes") else list(spec.partition_by)
                 for name, spec in S.TABLES.items()}


def make_older_lake(root) -> None:
    """A lake as an older HALO left it: format version 1, tables created with fewer columns, rows in them."""
    for name, spec in S.TABLES.items():
        cols = {"steps": OLD_STEPS_COLUMNS, "runs": OLD_RUNS_COLUMNS}.get(name, spec.column_names)
        schema = pa.schema([pa.field(c, spec.column(c).type) for c in cols])
        DeltaTable.create(str(root / name), schema=schema, partition_by=V1_PARTITIONS[name] or None)
    steps = pa.Table.from_pylist(
        [{"run_id": "old", "env": "miniwob", "episode_id": ids.episode_id("old", "t", 0, 0), "task_id": "t",
          "attempt_idx": 0, "task_seed": 0, "success": True, "step_idx": i, "url": "http://x", "prompt": "[]",
          "model_output": "noop()", "action": "noop()", "r_progress": 0.5, "r_success": float(i), "reward": 0.5 + i}
         for i in range(2)],
        schema=pa.schema([pa.field(c, S.STEPS.column(c).type) for c in OLD_STEPS_COLUMNS]),
    )
    write_deltalake(str(root / "steps"), steps, mode="append", partition_by=["env", "run_id"])
    (root / "meta").mkdir()
    (root / INFO_PATH).write_text(json.dumps({"format_version": 1, "tables": {}, "created_at": "", "created_by": "old"}))


def test_older_lake_with_fewer_columns_reads_new_columns_as_null(tmp_path):
    root = tmp_path / "lake"
    make_older_lake(root)
    lake = Lake.open(root)
    got = lake.query_arrow("select step_idx, model_output, state_hash, logprobs, r_novelty, cumulative_progress "
                           "from steps order by step_idx").to_pylist()
    assert got == [
        {"step_idx": 0, "model_output": "noop()", "state_hash": None, "logprobs": None, "r_novelty": None,
         "cumulative_progress": None},
        {"step_idx": 1, "model_output": "noop()", "state_hash": None, "logprobs": None, "r_novelty": None,
         "cumulative_progress": None},
    ]
    # every view runs on it
    assert count(lake, "select count(*) from episodes") == 1
    assert count(lake, "select count(*) from grpo_groups") == 4
    assert lake.query_arrow("select shaped_return from episodes").to_pylist() == [{"shaped_return": 2.0}]


def test_steps_per_run_counts_from_the_log_in_either_layout(tmp_path):
    from halo_data.ops import compact, steps_per_run

    root = tmp_path / "lake"
    make_older_lake(root)   # version 1: a run's files carry its run_id partition value
    assert steps_per_run(Lake.open(root)).to_pylist() == [{"run_id": "old", "steps": 2, "files": 1}]
    lake = Lake.init(tmp_path / "new")
    for run, attempts in (("a", 2), ("b", 1)):   # a writer per run, as rollouts write
        with EpisodeWriter(lake) as writer:
            for attempt in range(attempts):
                writer.write_episode(*one_episode(run_id=run, attempt=attempt))
    assert len(lake.files("steps")) == 2
    expected = [{"run_id": "a", "steps": 4, "files": 1}, {"run_id": "b", "steps": 2, "files": 1}]
    assert steps_per_run(lake).to_pylist() == expected   # one run per file: min = max
    compact(lake)
    assert len(lake.files("steps")) == 1
    assert steps_per_run(lake).to_pylist() == expected   # the packed file's run_id column, counted


def min_max_columns(lake: Lake, table: str) -> set[str]:
    """The columns some file of ``table`` has min/max statistics for in the Delta log."""
    actions = pa.table(lake.table(table).get_add_actions(flatten=True))
    return {name.removeprefix("min.") for name in actions.column_names
            if name.startswith("min.") and actions.column(name).null_count < actions.num_rows}


def test_the_log_holds_statistics_only_of_columns_reads_filter_on(tmp_path):
    from halo_data.lake import LONG_TEXT_COLUMNS, UNFILTERED_COLUMNS
    from halo_data.ops import compact

    lake = Lake.init(tmp_path / "lake")
    for run in ("a", "b"):
        with EpisodeWriter(lake) as writer:
            fields, steps = one_episode(run_id=run)
            writer.write_episode(fields, [{**s, "goal": "Click the button labelled OK.", "screenshot_hash": "ab" * 32,
                                           "screenshot_after_hash": "cd" * 32} for s in steps])
    unindexed = set(LONG_TEXT_COLUMNS["steps"]) | set(UNFILTERED_COLUMNS["steps"])
    for stage in ("written", "compacted"):
        stats = min_max_columns(lake, "steps")
        assert {"run_id", "episode_id", "task_id", "task_seed", "step_idx"} <= stats, stage
        assert not stats & unindexed, stage
        if stage == "written":
            compact(lake)
    # the columns without statistics keep their dictionary (an episode repeats its goal and URL) and read back whole
    (path,) = lake.files("steps")
    group = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)}
    assert "RLE_DICTIONARY" in encodings["goal"] and "RLE_DICTIONARY" in encodings["url"]
    assert "RLE_DICTIONARY" not in encodings["prompt"]
    assert lake.query_arrow("select distinct goal, url, screenshot_hash from steps").to_pylist() == [
        {"goal": "Click the button labelled OK.", "url": "http://x/", "screenshot_hash": "ab" * 32}]
    assert lake.query_arrow("select count(*) as n from steps where goal like 'Click%'").to_pylist() == [{"n": 4}]
    for name in ("candidates", "mcts_nodes"):   # their hashes and URLs too: no read filters on them
        lake.append(name, pa.Table.from_pylist([{"run_id": "a", "env": "miniwob", "task_id": "miniwob.click-button",
                                                 **{c: "f" * 64 for c in UNFILTERED_COLUMNS[name]}}]))
        stats = min_max_columns(lake, name)
        assert {"run_id", "task_id"} <= stats and not stats & set(UNFILTERED_COLUMNS[name]), name


def test_init_on_an_older_lake_evolves_the_schema(tmp_path):
    root = tmp_path / "lake"
    make_older_lake(root)
    lake = Lake.init(root)
    for name in ("steps", "runs"):
        assert set(S.TABLES[name].column_names) <= set(pa.schema(lake.table(name).schema().to_arrow()).names)
    with EpisodeWriter(lake) as writer:
        fields, steps = one_episode(run_id="new")
        writer.write_episode(fields, [{**s, "state_hash": "abc"} for s in steps])
    got = lake.query_arrow("select run_id, count(*) as n, count(state_hash) as hashed from steps group by 1 order by 1")
    assert got.to_pylist() == [{"run_id": "new", "n": 2, "hashed": 2}, {"run_id": "old", "n": 2, "hashed": 0}]


def test_upgrade_rewrites_an_older_lake_in_the_current_layout(tmp_path):
    from click.testing import CliRunner

    from halo_data.cli import main

    root = tmp_path / "lake"
    make_older_lake(root)
    lake = Lake.init(root)
    with EpisodeWriter(lake) as writer:
        for run in ("new", "other"):
            for attempt in range(2):
                writer.write_episode(*one_episode(run_id=run, attempt=attempt))
    assert lake.table("steps").metadata().partition_columns == ["env", "run_id"]   # writes kept the lake's layout
    assert lake.info.format_version == 1
    every_row = "select * from steps order by run_id, episode_id, step_idx"
    before = lake.query_arrow(every_row)
    scoped_before = lake.query_arrow("select * from episodes order by episode_id", runs=["new"])
    pinned = lake.versions()

    result = CliRunner().invoke(main, ["upgrade", "--lake", str(root)])

    assert result.exit_code == 0, result.output
    assert result.output.startswith("format version 1 -> 2; steps: partitioned by env (3 -> 1 files)")
    lake = Lake.open(root)
    assert lake.info.format_version == S.FORMAT_VERSION
    assert json.loads((root / INFO_PATH).read_text())["tables"]["steps"]["partition_by"] == ["env"]
    for name, spec in S.TABLES.items():
        assert lake.table(name).metadata().partition_columns == list(spec.partition_by), name
    assert lake.query_arrow(every_row).equals(before)
    assert "run_id" in min_max_columns(lake, "steps") and "url" not in min_max_columns(lake, "steps")
    assert lake.query_arrow("select * from episodes order by episode_id", runs=["new"]).equals(scoped_before)
    assert scoped_before.column("run_id").to_pylist() == ["new", "new"]
    # the snapshot before the rewrite stays readable in its own layout, and the lake takes new runs in the new one
    assert lake.query_arrow(every_row, as_of=",".join(f"{t}={v}" for t, v in pinned.items())).equals(before)
    with EpisodeWriter(lake) as writer:
        writer.write_episode(*one_episode(run_id="after"))
    assert lake.query_arrow("select run_id, count(*) as n from steps where run_id = 'after' group by 1").to_pylist() == \
        [{"run_id": "after", "n": 2}]
    again = CliRunner().invoke(main, ["upgrade", "--lake", str(root)])
    assert again.exit_code == 0 and again.output.strip() == f"lake {root} is already in format version 2: nothing to rewrite"
    lake.upsert_runs([{"run_id": "old", "kind": "rollout", "planned_episodes": 4}])
    assert lake.query_arrow("select run_id, planned_episodes from runs").to_pylist() == [
        {"run_id": "old", "planned_episodes": 4}]


def test_as_of_reads_older_snapshots(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    versions = []
    for attempt in range(3):
        with EpisodeWriter(lake) as writer:
            writer.write_episode(*one_episode(attempt=attempt))
        versions.append(lake.table("steps").version())
    assert versions == [1, 2, 3]
    assert [count(lake, "select count(*) from episodes", as_of=v) for v in versions] == [1, 2, 3]
    assert count(lake, "select count(*) from steps", as_of="steps=1") == 2
    assert count(lake, "select count(*) from steps", as_of="0") == 0
    with pytest.raises(LakeError, match="cannot open table steps"):
        lake.connect(as_of=99)


def test_connect_can_register_only_some_tables(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    with EpisodeWriter(lake) as writer:
        writer.write_episode(*one_episode())
    con = lake.connect(views=False, tables=("steps",))
    try:
        assert con.execute("select count(*) from steps").fetchone()[0] == 2
        with pytest.raises(Exception, match="episodes"):
            con.execute("select count(*) from episodes")
    finally:
        con.close()
    with pytest.raises(ValueError, match="views need them all"):
        lake.connect(tables=("steps",))
    with pytest.raises(ValueError, match="no such table: stepz"):
        lake.connect(views=False, tables=("stepz",))


def test_parse_as_of():
    assert parse_as_of(None) is None
    assert parse_as_of(4) == {"steps": 4}
    assert parse_as_of("4") == {"steps": 4}
    assert parse_as_of("steps=4, runs=2") == {"steps": 4, "runs": 2}
    assert parse_as_of("2024-01-02T03:04:05").isoformat() == "2024-01-02T03:04:05+00:00"
    with pytest.raises(LakeError, match="--as-of names unknown table 'stepz'"):
        parse_as_of("stepz=1")
    with pytest.raises(LakeError, match="is not a version"):
        parse_as_of("yesterday")


def test_episode_ids_are_deterministic():
    a = ids.episode_id("run-1", "miniwob.click-button", 3, 0)
    assert a == ids.episode_id("run-1", "miniwob.click-button", 3, 0)
    assert len(a) == 24 and int(a, 16) >= 0
    others = {ids.episode_id("run-2", "miniwob.click-button", 3, 0), ids.episode_id("run-1", "miniwob.click", 3, 0),
              ids.episode_id("run-1", "miniwob.click-button", 4, 0), ids.episode_id("run-1", "miniwob.click-button", 3, 1)}
    assert a not in others and len(others) == 4


def test_state_hash_ignores_element_ids_fragments_and_whitespace():
    a = ids.state_hash("http://x/inbox#top", "[12] button 'Send'\n  [13] link 'Home'")
    assert a == ids.state_hash("http://x/inbox/", "[40] button 'Send' [41]   link 'Home'")
    assert a != ids.state_hash("http://x/inbox", "[12] button 'Sent'\n[13] link 'Home'")
    assert a != ids.state_hash("http://x/outbox", "[12] button 'Send'\n  [13] link 'Home'")


def test_invalid_run_id_is_refused(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    with pytest.raises(ValueError, match="invalid run id '../evil'"):
        EpisodeWriter(lake).write_episode(*one_episode(run_id="../evil"))


def test_upsert_runs_keeps_one_row_per_run(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    lake.upsert_runs([{"run_id": "r1", "kind": "rollout", "status": "running", "planned_episodes": 10}])
    lake.upsert_runs([{"run_id": "r1", "kind": "rollout", "status": "finished", "planned_episodes": 10},
                      {"run_id": "r2", "kind": "train", "status": "running"}])
    lake.update_run("r2", status="failed")
    got = lake.query_arrow("select run_id, kind, status, planned_episodes from runs order by run_id").to_pylist()
    assert got == [{"run_id": "r1", "kind": "rollout", "status": "finished", "planned_episodes": 10},
                   {"run_id": "r2", "kind": "train", "status": "failed", "planned_episodes": None}]
    with pytest.raises(LakeError, match="no run 'r3'"):
        lake.update_run("r3", status="failed")


def test_unknown_columns_are_refused(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    with pytest.raises(LakeError, match="unknown column\\(s\\) for table train_metrics: lr"):
        lake.append("train_metrics", pa.Table.from_pylist([{"run_id": "t", "lr": 1.0}]))
    with pytest.raises(LakeError, match="unknown table 'nope'"):
        lake.table_uri("nope")


def test_an_upgrade_stopped_between_its_commits_is_finished_by_the_next(tmp_path, monkeypatch):
    from halo_data import ops, relayout

    root = tmp_path / "lake"
    make_older_lake(root)
    lake = Lake.init(root)
    with EpisodeWriter(lake) as writer:
        writer.write_episode(*one_episode(run_id="new"))
    every_row = "select * from steps order by run_id, episode_id, step_idx"
    before = lake.query_arrow(every_row)

    def killed_after_the_partitioning_commit(lake: Lake, name: str) -> bool:
        if lake.read_meta(f"meta/upgrade-{name}.json") is not None:
            raise SystemExit("killed")
        return False

    with monkeypatch.context() as patch:
        patch.setattr(relayout, "finish_rewrite", killed_after_the_partitioning_commit)
        with pytest.raises(SystemExit):
            ops.upgrade(Lake.open(root))
    lake = Lake.open(root)
    assert lake.table("steps").metadata().partition_columns == ["env"]
    assert lake.query_arrow("select count(*) as n from steps").to_pylist() == [{"n": 0}]   # between the commits
    assert lake.info.format_version == 1

    ops.upgrade(lake)

    lake = Lake.open(root)
    assert lake.query_arrow(every_row).equals(before)
    assert lake.read_meta("meta/upgrade-steps.json") is None and lake.info.format_version == S.FORMAT_VERSION


def test_an_upgrade_refuses_a_table_written_while_it_was_rewritten(tmp_path, monkeypatch):
    from halo_data import ops, relayout

    root = tmp_path / "lake"
    make_older_lake(root)
    lake = Lake.init(root)
    every_row = "select * from steps order by run_id, episode_id, step_idx"
    stats = relayout.file_stats

    def a_writer_appends_meanwhile(metadata, columns):
        if not lake.episode_ids("late"):
            with EpisodeWriter(lake) as writer:
                writer.write_episode(*one_episode(run_id="late"))
        return stats(metadata, columns)

    monkeypatch.setattr(relayout, "file_stats", a_writer_appends_meanwhile)
    with pytest.raises(LakeError, match=r"steps changed while it was rewritten .*run `halo-data upgrade` again"):
        ops.upgrade(Lake.open(root))
    monkeypatch.undo()
    lake = Lake.open(root)
    assert lake.table("steps").metadata().partition_columns == ["env", "run_id"]   # as it was, with the late run
    before = lake.query_arrow(every_row)
    assert sorted(set(before.column("run_id").to_pylist())) == ["late", "old"]
    ops.upgrade(lake)
    assert Lake.open(root).query_arrow(every_row).equals(before)
