"""``halo-data``: exact output and exact error lines, through click's CliRunner and the real console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from halo_data import ids
from halo_data import schema as S
from halo_data.cli import main
from halo_data.lake import INFO_PATH, Lake, LakeError
from halo_data.views import all_views
from halo_data.writer import EpisodeWriter

PROMPT = json.dumps([{"role": "system", "content": "act"}, {"role": "user", "content": "Goal: click OK"}])
READ_ONLY = "halo-data query is read-only (use SELECT; the lake changes only through halo-data's commands)"


def build(root: Path) -> Lake:
    """Two runs: r1 with two attempts at task t (one success), r2 with one attempt."""
    lake = Lake.init(root)
    with EpisodeWriter(lake, flush_episodes=1) as writer:
        for run_id, attempt, success, output in [("r1", 0, True, "click('1')"), ("r1", 1, False, "click('2')"),
                                                 ("r2", 0, False, "click('3')")]:
            writer.write_episode(
                {"run_id": run_id, "env": "miniwob", "task_id": "miniwob.t", "site": "miniwob", "task_seed": 0,
                 "attempt_idx": attempt, "success": success, "mode": "random"},
                [{"prompt": PROMPT, "model_output": output, "action": output, "action_valid": True,
                  "cumulative_progress": 1.0 if success else 0.0, "r_success": 1.0 if success else 0.0}])
    lake.upsert_runs([{"run_id": "r1", "kind": "rollout"}, {"run_id": "r2", "kind": "rollout"}])
    return lake


@pytest.fixture(scope="module")
def shared_lake(tmp_path_factory) -> Lake:
    return build(tmp_path_factory.mktemp("cli") / "lake")


@pytest.fixture()
def lake(tmp_path) -> Lake:
    return build(tmp_path / "lake")


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input)


def ok(*args: str, input: str | None = None) -> str:
    result = run(*args, input=input)
    assert result.exit_code == 0, result.output
    return result.stdout


def error(*args: str, input: str | None = None) -> str:
    """The one error line of a failing command (and that it failed with exit code 1, no traceback)."""
    result = run(*args, input=input)
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error: "), result.stderr
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    return result.stderr.rstrip("\n")


# ---------------------------------------------------------------------- query
SQL = "select run_id, count(*) as episodes, max(success) as any_success from episodes group by 1 order by 1"


def test_query_json_by_default_when_piped(shared_lake):
    assert ok(SQL, "--lake", shared_lake.root) == (
        '[\n {"run_id": "r1", "episodes": 2, "any_success": true},\n'
        ' {"run_id": "r2", "episodes": 1, "any_success": false}\n]\n')
    assert ok("query", SQL, "--lake", shared_lake.root, "--json") == ok(SQL, "--lake", shared_lake.root)
    assert ok("select 1 as x where false", "--lake", shared_lake.root) == "[]\n"


def test_query_table_nl_csv(shared_lake):
    assert ok(SQL, "--lake", shared_lake.root, "--table") == (
        "run_id  episodes  any_success\n"
        "------  --------  -----------\n"
        "r1      2         True\n"
        "r2      1         False\n")
    assert ok(SQL, "--lake", shared_lake.root, "--nl") == (
        '{"run_id": "r1", "episodes": 2, "any_success": true}\n'
        '{"run_id": "r2", "episodes": 1, "any_success": false}\n')
    assert ok(SQL, "--lake", shared_lake.root, "--csv") == "run_id,episodes,any_success\nr1,2,True\nr2,1,False\n"


def test_integers_print_as_integers_whatever_their_duckdb_type(shared_lake):
    # sum() of integers is a HUGEINT, which reaches Arrow as a decimal of scale 0; a real decimal stays a number
    sql = ("select run_id, sum(success::int) as successes, count(*)::uhugeint as n, 2.50::decimal(4, 2) as d "
           "from episodes group by 1 order by 1")
    assert ok(sql, "--lake", shared_lake.root) == (
        '[\n {"run_id": "r1", "successes": 1, "n": 2, "d": 2.5},\n {"run_id": "r2", "successes": 0, "n": 1, "d": 2.5}\n]\n')
    assert ok(sql, "--lake", shared_lake.root, "--nl") == (
        '{"run_id": "r1", "successes": 1, "n": 2, "d": 2.5}\n{"run_id": "r2", "successes": 0, "n": 1, "d": 2.5}\n')
    assert ok(sql, "--lake", shared_lake.root, "--csv") == "run_id,successes,n,d\nr1,1,2,2.5\nr2,0,1,2.5\n"
    assert ok(sql, "--lake", shared_lake.root, "--table") == (
        "run_id  successes  n  d\n"
        "------  ---------  -  ---\n"
        "r1      1          2  2.5\n"
        "r2      0          1  2.5\n")


def test_query_parquet_file(shared_lake, tmp_path):
    out = tmp_path / "out.parquet"
    result = run(SQL, "--lake", shared_lake.root, "--parquet", str(out))
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", f"2 rows written to {out}\n")
    assert pq.read_table(out).to_pylist() == [{"run_id": "r1", "episodes": 2, "any_success": True},
                                              {"run_id": "r2", "episodes": 1, "any_success": False}]


def test_query_parquet_streams_in_batches_and_a_query_failing_midway_leaves_the_file_as_it_was(shared_lake, tmp_path):
    from halo_data.query import write_query_parquet

    out = tmp_path / "out.parquet"
    rows = write_query_parquet(shared_lake, out, "select x from range(2500) t(x)", batch_rows=1000)
    assert rows == 2500 and pq.read_table(out).column("x").to_pylist() == list(range(2500))
    # fails on a row of the third batch, after two were written
    late = "select case when x >= 2200 then error('row 2200') else x end as x from range(2500) t(x)"
    with pytest.raises(LakeError, match="^Invalid Input Error: row 2200$"):
        write_query_parquet(shared_lake, out, late, batch_rows=1000)
    assert pq.read_table(out).num_rows == 2500 and sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet"]
    assert error(late, "--lake", shared_lake.root, "--parquet", str(out)) == "Error: Invalid Input Error: row 2200"
    assert pq.read_table(out).num_rows == 2500
    result = run("select * from steps where false", "--lake", shared_lake.root, "--parquet", str(out))
    assert (result.exit_code, result.stderr) == (0, f"0 rows written to {out}\n")
    assert pq.read_table(out).schema.names == [c.name for c in S.STEPS.columns]


def test_query_stdin_and_named_parameters(shared_lake):
    assert ok("query", "-", "--lake", shared_lake.root, "--nl", input="select count(*) as n from steps\n") == '{"n": 3}\n'
    assert ok("select count(*) as n from steps where run_id = $run", "-p", "run", "r2", "--lake", shared_lake.root,
              "--nl") == '{"n": 1}\n'
    assert ok("select 1 as a; select 2 as b", "--lake", shared_lake.root, "--nl") == '{"b": 2}\n'


def test_query_as_of_and_lake_from_environment(shared_lake, monkeypatch):
    assert ok("select count(*) as n from steps", "--lake", shared_lake.root, "--as-of", "1", "--nl") == '{"n": 1}\n'
    assert ok("select count(*) as n from steps", "--lake", shared_lake.root, "--as-of", "steps=2,runs=0",
              "--nl") == '{"n": 2}\n'
    monkeypatch.setenv("HALO_LAKE", shared_lake.root)
    assert ok("select count(*) as n from runs", "--nl") == '{"n": 2}\n'


def test_query_views_and_view_parameters(shared_lake):
    sql = "select run_id, attempt_idx, shaped_return from episodes order by 1, 2"
    assert ok(sql, "--lake", shared_lake.root, "--csv", "--set", "w_success=3") == (
        "run_id,attempt_idx,shaped_return\nr1,0,3.0\nr1,1,0.0\nr2,0,0.0\n")
    assert error(sql, "--lake", shared_lake.root, "--set", "w_speed=1") == (
        "Error: unknown view parameter 'w_speed': use gamma, omega, top_percent, dpo_pairing, dpo_scope, group_scope, w_<component>")
    assert error(sql, "--lake", shared_lake.root, "--set", "gamma") == (
        "Error: bad parameter 'gamma': write NAME=VALUE, e.g. gamma=0.95")


def test_bad_sql_is_one_error_line(shared_lake):
    assert error("selec 1", "--lake", shared_lake.root) == 'Error: Parser Error: syntax error at or near "selec"'
    assert error("select * from nope", "--lake", shared_lake.root) == (
        "Error: unknown table or view 'nope': tables are runs, steps, screenshots, candidates, mcts_nodes, "
        "train_metrics; `halo-data views` lists the views")
    assert error("select nope from steps", "--lake", shared_lake.root).startswith(
        'Error: Binder Error: Referenced column "nope" not found')
    assert error("", "--lake", shared_lake.root) == "Error: no SQL statement given"


@pytest.mark.parametrize("sql, kind", [
    ("insert into runs (run_id) values ('x')", "insert"),
    ("delete from steps", "delete"),
    ("update runs set kind = 'x'", "update"),
    ("copy steps to 'out.csv'", "copy"),
    ("attach 'other.duckdb' as other", "attach"),
    ("install httpfs", "install"),
    ("load httpfs", "load"),
    ("create table x as select 1", "create"),
    ("drop view episodes", "drop"),
    ("set threads = 1", "set"),
    ("select 1; delete from steps", "delete"),
    ("with x as (select 1) insert into runs (run_id) select 'a'", "insert"),
])
def test_writing_statements_are_refused(shared_lake, sql, kind):
    assert error(sql, "--lake", shared_lake.root) == f"Error: {kind} statements are not allowed: {READ_ONLY}"
    assert ok("select count(*) as n from steps", "--lake", shared_lake.root, "--nl") == '{"n": 3}\n'


def test_missing_lake_and_newer_format(tmp_path, lake):
    missing = tmp_path / "nowhere"
    assert error("select 1", "--lake", str(missing)) == (
        f"Error: no HALO lake at {missing}: create one with `halo-data init {missing}` or pass --lake PATH")
    info = json.loads((Path(lake.root) / INFO_PATH).read_text())
    info["format_version"] = S.FORMAT_VERSION + 1
    (Path(lake.root) / INFO_PATH).write_text(json.dumps(info))
    assert error("select 1", "--lake", lake.root) == (
        f"Error: lake {lake.root} has format version {S.FORMAT_VERSION + 1}, this HALO reads up to "
        f"{S.FORMAT_VERSION}: upgrade HALO (pip install -U halo) to read it")


# ---------------------------------------------------------------------- init, views, describe
def test_init(tmp_path):
    root = tmp_path / "new"
    assert ok("init", str(root)) == f"lake ready at {root} (format version 2)\n"
    assert ok("init", str(root)) == f"lake ready at {root} (format version 2)\n"
    assert sorted(p.name for p in root.iterdir()) == sorted(["meta", *S.TABLES])
    # --lake, as every other lake command takes it; both spellings of the same lake agree
    assert ok("init", "--lake", str(tmp_path / "other")) == f"lake ready at {tmp_path / 'other'} (format version 2)\n"
    assert ok("init", str(root), "--lake", str(root)) == f"lake ready at {root} (format version 2)\n"
    assert error("init", str(root), "--lake", str(tmp_path / "other")) == (
        f"Error: two lakes given ({root} and --lake {tmp_path / 'other'}): give one")


def test_a_plain_file_is_not_a_lake(tmp_path, shared_lake):
    plain = tmp_path / "notes.txt"
    plain.write_text("not a lake")
    expected = f"Error: {plain} is a file, not a lake: a lake is a folder (`halo-data init PATH` creates one)"
    assert error("init", str(plain)) == expected
    assert error("init", "--lake", str(plain)) == expected
    assert error("select 1", "--lake", str(plain)) == expected
    assert error("import", str(plain), "--lake", str(plain)) == expected
    assert plain.read_text() == "not a lake"


def test_commands_that_add_data_create_a_missing_lake(tmp_path):
    """import creates the lake as init would (as rollout does); commands that read say how to create one."""
    source = tmp_path / "episode.jsonl"
    source.write_text(
        '{"type": "episode_start", "task_id": "t", "goal": "g"}\n'
        '{"step": 0, "action": "click(\'1\')", "reward": 1.0}\n'
        '{"type": "episode_end", "success": true}\n')
    root = tmp_path / "fresh"
    assert error("stats", "--lake", str(root)) == (
        f"Error: no HALO lake at {root}: create one with `halo-data init {root}` or pass --lake PATH")
    assert ok("import", str(source), "--lake", str(root)) == f"imported 1 episodes (1 steps) into {root}\n"
    assert ok("select count(*) as n from steps", "--lake", str(root), "--nl") == '{"n": 1}\n'


EXPECTED_VIEWS = ["screenshots", "step_rewards", "episodes", "episode_summary", "progress_ranking", "bc_rows", "mcts_pairs",
                  "dpo_pairs", "grpo_groups", "reward_stats", "eval_matrix", "verified_actions", "episode_costs",
                  "state_groups"]


def test_views_lists_every_view_with_its_description():
    out = ok("views")
    width = max(map(len, EXPECTED_VIEWS))
    descriptions = {v.name: v.description for v in all_views()}
    assert out.splitlines() == [f"{name.ljust(width)}  {descriptions[name]}" for name in EXPECTED_VIEWS]
    assert all(len(d) > 20 for d in descriptions.values())
    assert [v["view"] for v in json.loads(ok("views", "--json"))] == EXPECTED_VIEWS


def test_describe_table_and_view(shared_lake):
    lines = ok("describe", "train_metrics", "--lake", shared_lake.root).splitlines()
    assert lines == [
        "run_id     VARCHAR                   Training run (partition key).",
        "step       BIGINT                    Optimizer step.",
        "epoch      DOUBLE                    Fractional epoch.",
        "metric     VARCHAR                   Namespaced metric name: loss, rewards/chosen, frac_reward_zero_std, ...",
        "value      DOUBLE                    Metric value.",
        "logged_at  TIMESTAMP WITH TIME ZONE  When logged.",
    ]
    dpo = ok("describe", "dpo_pairs", "--lake", shared_lake.root).splitlines()
    assert [line.split()[0] for line in dpo][:7] == ["source", "run_id", "task_id", "prompt_hash", "prompt", "chosen",
                                                     "rejected"]
    assert error("describe", "nope", "--lake", shared_lake.root) == (
        "Error: unknown table or view 'nope': tables are runs, steps, screenshots, candidates, mcts_nodes, "
        "train_metrics; `halo-data views` lists the views")


# ---------------------------------------------------------------------- export
def test_export_jsonl_in_trl_column_names(shared_lake, tmp_path):
    out = tmp_path / "dpo.jsonl"
    assert ok("export", "dpo_pairs", str(out), "--lake", shared_lake.root) == f"1 rows of dpo_pairs written to {out}\n"
    [pair] = [json.loads(line) for line in out.read_text().splitlines()]
    assert pair["prompt"] == json.loads(PROMPT)
    assert pair["chosen"] == [{"role": "assistant", "content": "click('1')"}]
    assert pair["rejected"] == [{"role": "assistant", "content": "click('2')"}] or pair["rejected"] == [
        {"role": "assistant", "content": "click('3')"}]
    assert pair["chosen_episode_id"] == ids.episode_id("r1", "miniwob.t", 0, 0)
    bc = tmp_path / "bc.jsonl"
    assert ok("export", "bc_rows", str(bc), "--lake", shared_lake.root, "--top-percent", "100") == (
        f"3 rows of bc_rows written to {bc}\n")
    rows = [json.loads(line) for line in bc.read_text().splitlines()]
    assert sorted(r["completion"][0]["content"] for r in rows) == ["click('1')", "click('2')", "click('3')"]
    assert all(r["prompt"] == json.loads(PROMPT) for r in rows)


def test_export_parquet_with_where_and_top_percent(shared_lake, tmp_path):
    out = tmp_path / "bc.parquet"
    assert ok("export", "bc_rows", str(out), "--lake", shared_lake.root, "--top-percent", "1") == (
        f"1 rows of bc_rows written to {out}\n")
    assert pq.read_table(out).select(["completion", "success"]).to_pylist() == [
        {"completion": "click('1')", "success": True}]
    assert ok("export", "bc_rows", str(out), "--lake", shared_lake.root, "--top-percent", "100",
              "--where", "run_id = 'r2'") == f"1 rows of bc_rows written to {out}\n"
    assert pq.read_table(out).column("completion").to_pylist() == ["click('3')"]
    assert error("export", "nope", str(out), "--lake", shared_lake.root) == (
        "Error: unknown view 'nope': `halo-data views` lists them (" + ", ".join(EXPECTED_VIEWS) + ")")
    assert error("export", "bc_rows", str(out), "--lake", shared_lake.root, "--where", "1; delete from steps") == (
        f"Error: delete statements are not allowed: {READ_ONLY}")
    assert error("export", "bc_rows", str(out), "--lake", shared_lake.root, "--top-percent", "0") == (
        "Error: top_percent must be in (0, 100], got 0.0")
    # a view whose rows fail while they stream: the file written before stays as it was, in either format
    jsonl = tmp_path / "bc.jsonl"
    ok("export", "bc_rows", str(jsonl), "--lake", shared_lake.root, "--top-percent", "100")
    before = {p.name: p.read_bytes() for p in (out, jsonl)}
    for target in (out, jsonl):
        assert error("export", "bc_rows", str(target), "--lake", shared_lake.root, "--top-percent", "100",
                     "--where", "error('no row') is null") == "Error: Invalid Input Error: no row"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# ---------------------------------------------------------------------- maintenance
def test_stats(shared_lake):
    rows = json.loads(ok("stats", "--lake", shared_lake.root, "--json"))
    assert [(r["table"], r["rows"], r["files"], r["version"]) for r in rows] == [
        ("runs", 2, 1, 1), ("steps", 3, 3, 3), ("screenshots", 0, 0, 0), ("candidates", 0, 0, 0),
        ("mcts_nodes", 0, 0, 0), ("train_metrics", 0, 0, 0)]
    assert all(r["bytes"] > 0 for r in rows if r["files"])
    assert {r["table"]: r["log_bytes"] for r in rows} == {
        r["table"]: sum(f.stat().st_size for f in (Path(shared_lake.root) / r["table"] / "_delta_log").iterdir())
        for r in rows}
    table = ok("stats", "--lake", shared_lake.root).splitlines()
    assert table[0].split() == ["table", "rows", "files", "bytes", "version", "log_bytes"]
    assert table[2].split()[:3] == ["runs", "2", "1"]


def test_compact_and_vacuum(lake):
    assert ok("compact", "--lake", lake.root) == "dropped 0 screenshot copies; steps: 3 -> 1 files\n"
    assert ok("compact", "--lake", lake.root) == "dropped 0 screenshot copies; nothing to merge\n"
    assert ok("vacuum", "--lake", lake.root, "--retention-hours", "0", "--dry-run") == "would delete 3 files\n"
    assert ok("select count(*) as n from steps", "--lake", lake.root, "--as-of", "3", "--nl") == '{"n": 3}\n'
    assert ok("vacuum", "--lake", lake.root, "--retention-hours", "0") == "deleted 3 files\n"
    assert ok("select count(*) as n from steps", "--lake", lake.root, "--nl") == '{"n": 3}\n'
    assert ok("validate", "--lake", lake.root) == "lake is valid\n"



def test_vacuum_deletes_the_delta_checkpoints_reads_no_longer_start_from(lake):
    """A checkpoint every 10 commits lists every file of its version; vacuum keeps the newest one committed before
    the retention and every commit, so each version of an append-only table reads as before."""
    with EpisodeWriter(lake, flush_episodes=1) as writer:  # steps: versions 0-3 from the build, then 4-24
        for seed in range(21):
            writer.write_episode(
                {"run_id": "r3", "env": "miniwob", "task_id": "miniwob.t", "site": "miniwob", "task_seed": seed,
                 "attempt_idx": 0, "success": False, "mode": "random"},
                [{"prompt": PROMPT, "model_output": "noop()", "action": "noop()", "action_valid": True}])
    assert sorted(lake.checkpoints("steps")) == [9, 19]  # after each 10th commit
    log_bytes = {r["table"]: r["log_bytes"] for r in json.loads(ok("stats", "--lake", lake.root, "--json"))}
    sql = "select count(*) as n from steps"
    before = {v: ok(sql, "--lake", lake.root, "--as-of", f"steps={v}", "--nl") for v in (5, 9, 15, 24)}
    assert ok("vacuum", "--lake", lake.root, "--dry-run") == "would delete 0 files\n"  # all within 168 h
    assert ok("vacuum", "--lake", lake.root, "--retention-hours", "0") == (
        "deleted 1 files (1 of them superseded Delta checkpoints)\n")
    assert sorted(lake.checkpoints("steps")) == [19]
    after = {r["table"]: r["log_bytes"] for r in json.loads(ok("stats", "--lake", lake.root, "--json"))}
    assert after["steps"] < log_bytes["steps"] and {**after, "steps": 0} == {**log_bytes, "steps": 0}
    assert {v: ok(sql, "--lake", lake.root, "--as-of", f"steps={v}", "--nl") for v in before} == before
    assert ok("validate", "--lake", lake.root, "--all-versions") == "lake is valid\n"

def test_validate_detects_a_truncated_parquet_file(lake):
    assert ok("validate", "--lake", lake.root) == "lake is valid\n"
    victim = sorted(lake.files("steps"))[0]
    data = Path(victim).read_bytes()
    Path(victim).write_bytes(data[: len(data) // 2])
    result = run("validate", "--lake", lake.root)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"Error: steps: unreadable file {victim}: ")
    os.remove(victim)
    result = run("validate", "--lake", lake.root)
    assert result.exit_code == 1
    assert result.stderr == f"Error: steps: missing file {victim} (version 3)\n"
    assert ok("repair", "--lake", lake.root, "--dry-run") == "would forget 1 missing files: steps 1\n"
    assert ok("repair", "--lake", lake.root) == "forgot 1 missing files: steps 1\n"
    assert ok("validate", "--lake", lake.root) == "lake is valid\n"
    assert ok("repair", "--lake", lake.root) == "forgot 0 missing files\n"


def test_quarantine_deletes_a_run_recoverable_with_as_of(lake):
    assert ok("quarantine", "r1", "--lake", lake.root) == (
        "deleted 3 rows of run r1; read them back with --as-of "
        "runs=1,steps=3,screenshots=0,candidates=0,mcts_nodes=0,train_metrics=0\n")
    assert ok("select run_id, count(*) as n from steps group by 1", "--lake", lake.root, "--nl") == (
        '{"run_id": "r2", "n": 1}\n')
    assert ok("select run_id from runs", "--lake", lake.root, "--nl") == '{"run_id": "r2"}\n'
    assert ok("select run_id, count(*) as n from steps group by 1 order by 1", "--lake", lake.root, "--nl",
              "--as-of", "steps=3,runs=1") == '{"run_id": "r1", "n": 2}\n{"run_id": "r2", "n": 1}\n'
    assert error("quarantine", "r1", "--lake", lake.root) == (
        f"Error: no run 'r1' in {lake.root}: `halo-data query \"select run_id from runs\"` lists them")
    assert ok("validate", "--lake", lake.root) == "lake is valid\n"


# ---------------------------------------------------------------------- the real console script
def test_console_script(shared_lake):
    exe = Path(sys.executable).parent / "halo-data"
    assert exe.exists(), "the package is not installed: pip install -e ."
    env = {**os.environ, "HALO_LAKE": shared_lake.root}
    done = subprocess.run([str(exe), "select count(*) as n from steps"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, '[\n {"n": 3}\n]\n', "")
    bad = subprocess.run([str(exe), "query", "selec 1"], capture_output=True, text=True, env=env, timeout=60)
    assert (bad.returncode, bad.stdout, bad.stderr) == (1, "", 'Error: Parser Error: syntax error at or near "selec"\n')
    piped = subprocess.run([str(exe), "query", "-", "--csv"], input="select 7 as seven", capture_output=True,
                           text=True, env=env, timeout=60)
    assert (piped.returncode, piped.stdout) == (0, "seven\n7\n")
