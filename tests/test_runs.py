"""The runs rows every kind of run builds through ``halo_data.runs``: provenance, redaction, upsert."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import pytest

from halo_data.lake import Lake
from halo_data.runs import RunRecord, RunRecordError, existing_run, provenance, redact_argv, upsert_runs

ROOT = Path(__file__).resolve().parent.parent
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def head_sha() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_provenance_records_packages_git_sha_host_and_python():
    prov = provenance(generator="test")
    assert prov["git_sha"] == head_sha()
    assert {"duckdb", "deltalake", "pyarrow"} <= set(prov["packages"])
    assert prov["host"] and prov["python"].count(".") == 2 and prov["generator"] == "test"


def test_a_run_row_hides_secrets_in_config_command_and_provenance():
    key = "sk-abcdefghijklmnop"
    record = RunRecord(
        run_id="r1", kind="rollout", started_at=T0,
        config={"policy_options": {"api_key": key, "base_url": "http://x"}, "note": f"uses {key}"},
        command=["halo-agent", "rollout", "--api-key", key, "--hf-token=hf_abcdefghijk", "--tasks", "a"],
        provenance=provenance(endpoint_password="hunter2"),
    )
    row = record.row()
    assert key not in json.dumps(row, default=str) and "hunter2" not in row["provenance"]
    assert json.loads(row["config"]) == {"policy_options": {"api_key": "[REDACTED]", "base_url": "http://x"}, "note": "uses [REDACTED]"}
    assert row["command"] == "halo-agent rollout --api-key '[REDACTED]' '--hf-token=[REDACTED]' --tasks a"
    assert row["command"] == redact_argv(record.command)
    assert RunRecord(run_id="r1", kind="train", command=f"halo-train bc --note {key}").row()["command"] == "halo-train bc --note [REDACTED]"
    # Token counts are not tokens: a loop's config keeps its max_tokens, a command its --max-tokens.
    counts = RunRecord(run_id="r2", kind="train", config={"max_tokens": 64, "auth_token": "abc"},
                       command=["halo-train", "online-grpo", "--max-tokens", "64", "--hf-token", "abc"]).row()
    assert json.loads(counts["config"]) == {"max_tokens": 64, "auth_token": "[REDACTED]"}
    assert counts["command"] == "halo-train online-grpo --max-tokens 64 --hf-token '[REDACTED]'"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"run_id": "bad id", "kind": "rollout"}, "run field 'run_id'"),
        ({"run_id": "r1", "kind": "sample"}, "run field 'kind' must be one of rollout, eval, train, got 'sample'"),
        ({"run_id": "r1", "kind": "eval", "status": "done"}, "run field 'status' must be one of"),
        ({"run_id": "r1", "kind": "eval", "started_at": dt.datetime(2026, 1, 1)}, "run field 'started_at' must be a timezone-aware"),
    ],
)
def test_a_bad_run_field_fails_where_the_record_is_built(fields, message):
    with pytest.raises(RunRecordError, match=message.replace("(", r"\(")):
        RunRecord(**fields)


def test_upsert_keeps_one_row_per_run_and_its_provenance(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    running = RunRecord(run_id="t1", kind="train", job_type="bc", lineage={"steps": 3}, started_at=T0)
    upsert_runs(lake, [running])
    upsert_runs(lake, [running.replace(status="finished", ended_at=T0 + dt.timedelta(hours=1))])
    rows = lake.query_arrow("select * from runs").to_pylist()
    assert len(rows) == 1 and existing_run(lake, "t1") == rows[0]
    assert (rows[0]["status"], json.loads(rows[0]["lineage"])) == ("finished", {"steps": 3})
    assert json.loads(rows[0]["provenance"])["git_sha"] == head_sha()
    assert existing_run(lake, "t2") is None
