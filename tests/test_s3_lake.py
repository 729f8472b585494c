"""The lake on object storage: a real S3 endpoint (moto's server) on 127.0.0.1, started and stopped here.

Credentials come from the usual AWS variables only; the tests check that none of them reaches any
object in the bucket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bench import s3_server
from halo_data import ids
from halo_data.cli import main
from halo_data.lake import Lake, LakeError
from halo_data.runs import RunRecord, upsert_runs

SECRET = "halo/test+Secret0123456789abcdefghijklmnop"
KEY_ID = "AKIAHALOTESTKEY00001"
TASK = "miniwob.click-button"


RECORDINGS: dict[str, Path] = {}  # moto endpoint -> the file its request recorder writes


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """moto's S3 server on loopback for this module, with S3's atomic conditional writes (``bench.s3_server``);
    stopped after it. Requests it
    receives while recording (``/moto-api/recorder/start-recording``) are logged to ``<url>.recording``."""
    recording = tmp_path_factory.mktemp("moto") / "requests.jsonl"
    proc, url = s3_server.start(recording)
    RECORDINGS[url] = recording
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def s3_lake(s3_endpoint, monkeypatch):
    """An ``s3://`` lake root in a fresh bucket, with credentials and conditional puts in the environment."""
    import boto3

    for k, v in {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": s3_endpoint, "AWS_ALLOW_HTTP": "true", "AWS_CONDITIONAL_PUT": "etag"}.items():
        monkeypatch.setenv(k, v)
    bucket = f"halo-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/lake"


def bucket_objects(root: str) -> dict[str, bytes]:
    import boto3

    bucket = root.split("/")[2]
    s3 = boto3.client("s3")
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket) for o in page.get("Contents", [])]
    return {k: s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def assert_no_credentials(root: str) -> None:
    objects = bucket_objects(root)
    assert objects
    for key, body in objects.items():
        for secret in (SECRET, KEY_ID):
            assert secret.encode() not in body, f"{secret} stored in {key}"


def write_episodes(lake: Lake, run_id: str, attempts: range) -> None:
    from halo_data.writer import EpisodeWriter

    with EpisodeWriter(lake, flush_episodes=2) as writer:
        for a in attempts:
            writer.write_episode({"run_id": run_id, "env": "miniwob", "task_id": TASK, "task_seed": 0, "attempt_idx": a,
                                  "success": a % 2 == 0},
                                 [{"prompt": f"[{a}.{i}]", "model_output": "click('1')"} for i in range(3)])


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_init_query_compact_and_time_travel_through_the_cli(s3_lake, tmp_path):
    assert cli("init", s3_lake) == f"lake ready at {s3_lake} (format version 2)\n"
    lake = Lake.open(s3_lake)
    write_episodes(lake, "r1", range(0, 4))
    first = lake.table("steps").version()
    write_episodes(lake, "r1", range(4, 6))
    # a key id in a lake URI of the command line is redacted like any other key
    upsert_runs(lake, [RunRecord(run_id="r1", kind="rollout", command=["halo-agent", "rollout", "--lake", f"s3://{KEY_ID}:x@b/l"])])

    out = cli("query", "--lake", s3_lake, "--json", "select count(*) as n, count(distinct episode_id) as e from episodes")
    assert json.loads(out) == [{"n": 6, "e": 6}]
    out = cli("query", "--lake", s3_lake, "--json", "--as-of", str(first), "select count(*) as e from episodes")
    assert json.loads(out) == [{"e": 4}]
    # the views run over the S3 snapshot as over a local one
    ranked = json.loads(cli("query", "--lake", s3_lake, "--json", "select count(*) as n from progress_ranking"))
    assert ranked == [{"n": 6}]
    # results stream from the S3 snapshot into local files, a batch at a time
    cli("query", "--lake", s3_lake, "--parquet", str(tmp_path / "steps.parquet"), "select * from steps")
    assert pq.read_table(tmp_path / "steps.parquet").num_rows == 18
    assert cli("export", "progress_ranking", str(tmp_path / "ranked.jsonl"), "--lake", s3_lake) == (
        f"6 rows of progress_ranking written to {tmp_path / 'ranked.jsonl'}\n")
    assert len((tmp_path / "ranked.jsonl").read_text().splitlines()) == 6

    files_before = len(lake.files("steps"))
    assert "steps: " in cli("compact", "--lake", s3_lake)
    assert files_before > 1 and len(lake.files("steps")) == 1
    # compaction is a new version: the old snapshot stays readable, and reads the same rows
    out = cli("query", "--lake", s3_lake, "--json", "--as-of", str(first), "select count(*) as e from episodes")
    assert json.loads(out) == [{"e": 4}]
    assert lake.query_arrow("select count(*) as n from steps").to_pylist() == [{"n": 18}]
    assert_no_credentials(s3_lake)


def test_vacuum_deletes_files_and_superseded_checkpoints_from_the_bucket(s3_lake):
    lake = Lake.init(s3_lake)
    write_episodes(lake, "r1", range(0, 4))
    for i in range(19):  # runs: a checkpoint after its 10th and 20th commits
        lake.upsert_runs([{"run_id": "r1", "kind": "rollout", "policy_version": f"v{i}"}])
    assert sorted(lake.checkpoints("runs")) == [9, 19]
    log_bytes = {r["table"]: r["log_bytes"] for r in json.loads(cli("stats", "--lake", s3_lake, "--json"))}
    assert log_bytes["runs"] == sum(len(v) for k, v in bucket_objects(s3_lake).items() if "/runs/_delta_log/" in k)
    cli("compact", "--lake", s3_lake)
    assert cli("vacuum", "--lake", s3_lake, "--retention-hours", "0") == (
        "deleted 21 files (1 of them superseded Delta checkpoints)\n")  # and the data files merges and compact replaced
    assert sorted(lake.checkpoints("runs")) == [19]
    assert json.loads(cli("stats", "--lake", s3_lake, "--json"))[0]["log_bytes"] < log_bytes["runs"]
    assert not [k for k in bucket_objects(s3_lake) if k.endswith("00000000000000000009.checkpoint.parquet")]
    out = cli("query", "--lake", s3_lake, "--json", "select count(*) as n, any_value(policy_version) as v from runs")
    assert json.loads(out) == [{"n": 1, "v": "v18"}]
    assert cli("validate", "--lake", s3_lake) == "lake is valid\n"


def test_writing_without_safe_commits_fails_with_one_line_and_writes_nothing(s3_lake, monkeypatch):
    monkeypatch.delenv("AWS_CONDITIONAL_PUT")
    result = CliRunner().invoke(main, ["init", s3_lake])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: {s3_lake}: writers to an S3 lake need safe commits: export AWS_CONDITIONAL_PUT=etag "
        "(S3, MinIO, R2), or AWS_S3_LOCKING_PROVIDER=dynamodb with DELTA_DYNAMO_TABLE_NAME\n"
    )
    assert bucket_objects(s3_lake) == {}
    # an existing lake opened without them reads, and refuses to append
    monkeypatch.setenv("AWS_CONDITIONAL_PUT", "etag")
    write_episodes(Lake.init(s3_lake), "r1", range(2))
    monkeypatch.delenv("AWS_CONDITIONAL_PUT")
    lake = Lake.open(s3_lake)
    assert lake.query_arrow("select count(*) as n from episodes").to_pylist() == [{"n": 2}]
    with pytest.raises(LakeError, match="need safe commits"):
        write_episodes(lake, "r1", range(2, 3))
    with pytest.raises(LakeError, match="need safe commits"):
        lake.upsert_runs([{"run_id": "r1", "kind": "rollout"}])
    assert lake.query_arrow("select count(*) as n from episodes").to_pylist() == [{"n": 2}]


WRITERS, PER_WRITER = 4, 6


def append_to_s3(root: str, writer_idx: int, start) -> None:
    start.wait(60)
    write_episodes(Lake.open(root), f"w{writer_idx}", range(PER_WRITER))


def test_four_spawned_writers_lose_and_duplicate_nothing(s3_lake, race_processes):
    lake = Lake.init(s3_lake)
    assert race_processes(append_to_s3, s3_lake, WRITERS) == [0] * WRITERS
    got = lake.query_arrow("""select count(*) as steps, count(distinct (episode_id, step_idx)) as distinct_steps,
                                     count(distinct episode_id) as episodes from steps""").to_pylist()
    assert got == [{"steps": WRITERS * PER_WRITER * 3, "distinct_steps": WRITERS * PER_WRITER * 3,
                    "episodes": WRITERS * PER_WRITER}]
    expected = {ids.episode_id(f"w{w}", TASK, 0, a) for w in range(WRITERS) for a in range(PER_WRITER)}
    assert {r["episode_id"] for r in lake.query_arrow("select distinct episode_id from steps").to_pylist()} == expected
    # one commit per flush of 2 episodes, none lost to another writer's
    assert lake.table("steps").version() == WRITERS * PER_WRITER // 2


@pytest.mark.browser
@pytest.mark.slow
def test_a_miniwob_rollout_lands_in_the_s3_lake_without_credentials(s3_lake):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    args = [sys.executable, "-m", "halo_agent.cli", "rollout", "--env", "miniwob", "--tasks", "click-button",
            "--rollouts-per-task", "2", "--max-steps", "3", "--seed", "1", "--lake", s3_lake, "--run-id", "s3-run"]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lake = Lake.open(s3_lake)
    episodes = lake.query_arrow("select episode_id, attempt_idx from episodes order by attempt_idx").to_pylist()
    assert [e["attempt_idx"] for e in episodes] == [0, 1]
    assert lake.query_arrow("select count(*) as n from steps s join screenshots on s.screenshot_hash = hash "
                            "where s.run_id = 's3-run'").column(0)[0].as_py() > 0
    run = lake.query_arrow("select status, planned_episodes from runs where run_id = 's3-run'").to_pylist()
    assert run == [{"status": "finished", "planned_episodes": 2}]
    assert_no_credentials(s3_lake)


def test_cursors_of_a_connection_read_the_s3_tables_as_the_dashboard_does(s3_lake):
    """The dashboard queries through one cursor per thread; an S3 lake's tables are Arrow datasets registered per
    connection, so each cursor registers them too."""
    from halo_data.reader import cursor

    lake = Lake.init(s3_lake)
    write_episodes(lake, "r1", range(3))
    con = lake.connect()
    cur = cursor(con)
    assert cur.execute("select count(*) from episodes").fetchall() == [(3,)]
    assert cur.execute("select count(*) from steps").fetchall() == [(9,)]


def recorded_requests(endpoint: str, action):
    """(method, path) of every request moto served while ``action()`` ran."""
    def call(what: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/recorder/{what}", method="POST"), timeout=10).close()

    call("reset-recording")
    call("start-recording")
    try:
        action()
    finally:
        call("stop-recording")
    lines = RECORDINGS[endpoint].read_text().splitlines()
    return [(e["method"], urllib.parse.unquote(urllib.parse.urlparse(e["url"]).path)) for e in map(json.loads, lines)]


def test_a_run_scoped_read_gets_only_that_runs_files(s3_lake, s3_endpoint):
    """What the online learner reads each iteration: one run's views, from that run's data files alone."""
    from halo_data.synthetic import CampaignGenerator, CampaignSpec

    lake = Lake.init(s3_lake)
    campaign = CampaignGenerator(CampaignSpec(run_steps=120, attempts_per_task=2, templates=1, screenshot_share=0.05))
    for i in range(3):
        campaign.append_run(lake, i)
    run = campaign.run_id(1)

    def read() -> None:
        con = lake.connect(runs=[run])
        try:
            for view in ("grpo_groups", "bc_rows", "dpo_pairs", "state_groups"):
                assert con.sql(f"select distinct run_id from {view}").fetchall() == [(run,)]
        finally:
            con.close()

    requests = recorded_requests(s3_endpoint, read)
    data_reads = [path for method, path in requests if method in ("GET", "HEAD") and path.endswith(".parquet")
                  and "/_delta_log/" not in path]
    # every data file read holds the run's rows alone (its run_id statistics, from the Delta log)
    runs_of_file = {}
    for name in ("runs", "steps", "candidates"):
        actions = pa.table(lake.table(name).get_add_actions(flatten=True)).to_pylist()
        runs_of_file.update({a["path"].rsplit("/", 1)[-1]: {a["min.run_id"], a["max.run_id"]} for a in actions})
    assert data_reads and all(runs_of_file[path.rsplit("/", 1)[-1]] == {run} for path in data_reads), data_reads
    # steps and candidates of the run were read; of the unpartitioned runs table only the file holding its row
    tables_read = {path.split("/lake/", 1)[1].split("/", 1)[0] for path in data_reads}
    assert {"steps", "candidates"} <= tables_read <= {"steps", "candidates", "runs"}, data_reads


def test_upgrade_rewrites_an_s3_lake_of_format_version_1(s3_lake):
    """`halo-data upgrade` on an object store: the files it writes and reads are S3 objects, its pending commit
    a lake file there too."""
    import dataclasses

    from halo_data import schema as S
    from halo_data.lake import INFO_PATH, LakeInfo

    v1 = {name: {"partition_by": ["env", "run_id"] if name in ("steps", "candidates", "mcts_nodes") else
                 list(spec.partition_by)} for name, spec in S.TABLES.items()}
    info = dataclasses.replace(LakeInfo.current(), format_version=1, tables=v1)
    Lake(s3_lake, info).write_meta(INFO_PATH, info.to_json())
    lake = Lake.init(s3_lake)   # a version 1 lake: its tables are made in the layout its info records
    assert lake.table("steps").metadata().partition_columns == ["env", "run_id"]
    write_episodes(lake, "r1", range(4))
    write_episodes(lake, "r2", range(2))
    every_row = "select * from steps order by run_id, episode_id, step_idx"
    before = lake.query_arrow(every_row)

    assert cli("upgrade", "--lake", s3_lake).startswith("format version 1 -> 2; steps: partitioned by env (")

    lake = Lake.open(s3_lake)
    assert lake.table("steps").metadata().partition_columns == ["env"] and lake.info.format_version == 2
    assert lake.query_arrow(every_row).equals(before)
    assert lake.query_arrow("select distinct run_id from episodes", runs=["r2"]).to_pylist() == [{"run_id": "r2"}]
    assert lake.read_meta("meta/upgrade-steps.json") is None
    assert_no_credentials(s3_lake)
