"""Faults lose nothing: killed rollouts and compactions, concurrent writers, a full disk, bad inputs.

Every test works on a real lake under tmp_path and drives the real CLIs or the
library in real processes (spawned, never forked: delta-rs refuses a forked child).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from halo_data import ids
from halo_data import schema as S
from halo_data.lake import Lake
from halo_data.ops import validate

SPAWN = multiprocessing.get_context("spawn")
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def lake_files(root: str | Path) -> dict[str, str]:
    """Every file of the lake with the sha256 of its bytes: what 'nothing already stored changes' compares."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def log_versions(root: str | Path, table: str) -> int:
    return len(list((Path(root) / table / "_delta_log").glob("*.json")))


def step_counts(lake: Lake, run_id: str | None = None) -> dict:
    where = "where run_id = $r" if run_id else ""
    return lake.query_arrow(
        f"""select count(*) as steps, count(distinct episode_id) as episodes,
                   count(distinct (episode_id, step_idx)) as distinct_steps from steps {where}""",
        {"r": run_id} if run_id else None,
    ).to_pylist()[0]


# ---------------------------------------------------------------------- rollouts killed with SIGKILL
ROLLOUT_TASKS = ["miniwob.click-checkboxes", "miniwob.enter-text"]
ROLLOUTS_PER_TASK = 3
ROLLOUT_STEPS = 3


def rollout_process(lake: Path, run_id: str, resume: bool) -> subprocess.Popen:
    """A rollout process that commits every 2 episodes (the CLI's default waits for 32)."""
    code = (
        "from halo_agent.rollout import RolloutConfig, run_rollouts\n"
        f"run_rollouts(RolloutConfig(env='miniwob', tasks={ROLLOUT_TASKS!r}, rollouts_per_task={ROLLOUTS_PER_TASK}, "
        f"max_steps={ROLLOUT_STEPS}, lake={str(lake)!r}, run_id={run_id!r}, resume={resume}, "
        "flush_episodes=2, flush_seconds=3600, progress=False))\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def kill_when(proc: subprocess.Popen, ready, timeout: float = 120, after: float = 0.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"rollout ended before the kill: {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the rollout never reached the point to kill it at")
        time.sleep(0.001)
    time.sleep(after)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL


def assert_lake_valid(root: Path) -> None:
    result = run_cli("halo-data", "validate", "--lake", str(root))
    assert (result.returncode, result.stdout) == (0, "lake is valid\n"), result.stderr


@pytest.mark.browser
@pytest.mark.slow
def test_rollout_killed_mid_flush_and_mid_episode_then_resume_completes_exactly_the_missing(tmp_path):
    root = tmp_path / "lake"
    Lake.init(root)
    run_id = "killed-rollout"
    expected = {ids.episode_id(run_id, t, 0, a) for t in ROLLOUT_TASKS for a in range(ROLLOUTS_PER_TASK)}

    # 1. SIGKILL inside the first flush: its screenshots commit landed, its steps commit may not have.
    shots_before = log_versions(root, "screenshots")
    proc = rollout_process(root, run_id, resume=False)
    kill_when(proc, lambda: log_versions(root, "screenshots") > shots_before)
    lake = Lake.open(root)
    first = step_counts(lake, run_id)
    assert first["episodes"] in (0, 2), first          # the killed flush: all there or all absent
    assert first["steps"] == first["distinct_steps"]
    assert_lake_valid(root)

    # 2. SIGKILL in the middle of an episode, after the resumed process's first commit of steps.
    steps_before = log_versions(root, "steps")
    proc = rollout_process(root, run_id, resume=True)
    kill_when(proc, lambda: log_versions(root, "steps") > steps_before, after=0.3)
    second = step_counts(lake, run_id)
    assert second["episodes"] in (first["episodes"] + 2, first["episodes"] + 4), (first, second)
    assert second["steps"] == second["distinct_steps"]
    assert_lake_valid(root)
    present = {r["episode_id"] for r in lake.query_arrow(
        "select distinct episode_id from steps where run_id = $r", {"r": run_id}).to_pylist()}
    assert present < expected

    # 3. --resume through the CLI runs exactly the missing episodes.
    result = run_cli("halo-agent", "rollout", "--env", "miniwob", "--tasks", ",".join(ROLLOUT_TASKS),
                     "--rollouts-per-task", str(ROLLOUTS_PER_TASK), "--max-steps", str(ROLLOUT_STEPS),
                     "--lake", str(root), "--run-id", run_id, "--resume", "--no-progress", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["skipped_episodes"] == len(present)
    assert summary["episodes_written"] == len(expected) - len(present)
    final = step_counts(lake, run_id)
    assert final["episodes"] == len(expected) and final["steps"] == final["distinct_steps"]
    assert {r["episode_id"] for r in lake.query_arrow("select distinct episode_id from steps").to_pylist()} == expected
    # episodes written before the kills are unchanged by the resume
    assert lake.query_arrow("select status from runs where run_id = $r", {"r": run_id}).to_pylist() == [{"status": "finished"}]
    assert_lake_valid(root)


# ---------------------------------------------------------------------- 8 writers, then compact
WRITERS = 8
EPISODES_PER_WRITER = 4
SHARED_PAGES = 3


def write_overlapping(root: str, writer_idx: int, start) -> None:
    """Every writer stores the same few page screenshots (as parallel rollouts of one task do)."""
    from halo_data.writer import EpisodeWriter, Screenshot
    from halo_data.synthetic import synthetic_png

    lake = Lake.open(root)
    shared = [Screenshot.from_bytes(synthetic_png(page, 24, 16)) for page in range(SHARED_PAGES)]
    start.wait(60)
    with EpisodeWriter(lake, flush_episodes=2, flush_seconds=3600, known_screenshots=()) as writer:
        for attempt in range(EPISODES_PER_WRITER):
            steps = [{"url": f"http://site/{i}", "prompt": f"w{writer_idx} a{attempt} s{i}", "model_output": "noop()",
                      "screenshot_hash": shared[i % SHARED_PAGES].hash} for i in range(5)]
            writer.write_episode({"run_id": "parallel", "env": "miniwob", "task_id": f"miniwob.task-{writer_idx}",
                                  "task_seed": 0, "attempt_idx": attempt}, steps, shared)


@pytest.mark.slow
def test_eight_writers_then_compact_leave_exact_rows_and_one_row_per_screenshot(tmp_path, race_processes):
    root = str(tmp_path / "lake")
    lake = Lake.init(root)
    assert race_processes(write_overlapping, root, WRITERS) == [0] * WRITERS

    result = run_cli("halo-data", "compact", "--lake", root)
    assert result.returncode == 0, result.stderr
    total = WRITERS * EPISODES_PER_WRITER
    assert step_counts(lake) == {"steps": total * 5, "episodes": total, "distinct_steps": total * 5}
    assert {r["episode_id"] for r in lake.query_arrow("select distinct episode_id from steps").to_pylist()} == {
        ids.episode_id("parallel", f"miniwob.task-{w}", 0, a) for w in range(WRITERS) for a in range(EPISODES_PER_WRITER)}
    # after compact, storage itself holds one row per image, not only the view
    shots = lake.query_arrow("select count(*) as n, count(distinct hash) as d from screenshots_all").to_pylist()
    assert shots == [{"n": SHARED_PAGES, "d": SHARED_PAGES}]
    assert [str(p) for p in validate(lake)] == []


# ---------------------------------------------------------------------- compact killed midway, under a reader
def build_fragmented_lake(root: str, commits: int) -> None:
    from halo_data.writer import EpisodeWriter, Screenshot

    lake = Lake.init(root)
    same = Screenshot.from_bytes(b"\x89PNG\r\n\x1a\n stored by two writers")
    for writer_idx in range(2):
        with EpisodeWriter(lake, flush_episodes=1, known_screenshots=()) as writer:
            for attempt in range(commits // 2):
                writer.write_episode(
                    {"run_id": f"run{attempt % 3}", "env": "miniwob", "task_id": f"miniwob.t{writer_idx}",
                     "task_seed": 0, "attempt_idx": attempt},
                    [{"prompt": f"{writer_idx}-{attempt}-{i}", "model_output": "noop()", "screenshot_hash": same.hash}
                     for i in range(3)], [same])


@pytest.mark.slow
def test_compact_killed_midway_loses_nothing_and_the_next_compact_finishes(tmp_path):
    root = str(tmp_path / "lake")
    build_fragmented_lake(root, commits=40)
    lake = Lake.open(root)
    counts_sql = """select (select count(*) from steps) as steps,
                           (select count(distinct (episode_id, step_idx)) from steps) as distinct_steps,
                           (select count(*) from screenshots) as shots"""
    expected = lake.query_arrow(counts_sql).to_pylist()
    assert expected == [{"steps": 120, "distinct_steps": 120, "shots": 1}]
    reader = lake.connect()               # a reader holding the pre-compaction snapshot throughout
    held = reader.execute(counts_sql).fetchall()

    logs = {t: log_versions(root, t) for t in ("steps", "screenshots", "runs")}
    proc = subprocess.Popen([str(BIN / "halo-data"), "compact", "--lake", root], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    kill_when(proc, lambda: any(log_versions(root, t) > n for t, n in logs.items()))
    after_kill = {t: log_versions(root, t) for t in logs}
    assert after_kill != logs               # it was killed after committing part of its work

    assert Lake.open(root).query_arrow(counts_sql).to_pylist() == expected
    assert [str(p) for p in validate(lake)] == []
    assert reader.execute(counts_sql).fetchall() == held

    result = run_cli("halo-data", "compact", "--lake", root)
    assert result.returncode == 0, result.stderr
    assert reader.execute(counts_sql).fetchall() == held
    reader.close()
    assert lake.query_arrow(counts_sql).to_pylist() == expected
    assert lake.query_arrow("select count(*) from screenshots_all").column(0)[0].as_py() == 1
    partitions = lake.query_arrow("select count(distinct env) from steps").column(0)[0].as_py()
    assert len(lake.files("steps")) == partitions          # finished: one file per partition
    assert [str(p) for p in validate(lake, all_versions=True)] == []
    again = run_cli("halo-data", "compact", "--lake", root)
    assert again.returncode == 0 and "nothing to merge" in again.stdout


# ---------------------------------------------------------------------- disk full while writing
FILE_SIZE_LIMIT = 256 * 1024   # bytes any file this process writes may reach (RLIMIT_FSIZE)


def write_past_the_file_size_limit(root: str, conn) -> None:
    """A writer whose files cannot grow past FILE_SIZE_LIMIT: writes fail with EFBIG, as on a full disk."""
    from halo_data.writer import EpisodeWriter, LakeWriteError, Screenshot

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # get the EFBIG error instead of being killed
    lake = Lake.open(root)
    writer = EpisodeWriter(lake, flush_episodes=100, flush_seconds=3600)
    writer._load_known()
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    for attempt in range(4):
        shots = [Screenshot.from_bytes(os.urandom(200_000) + bytes([attempt, i])) for i in range(3)]
        writer.write_episode({"run_id": "full-disk", "env": "miniwob", "task_id": "miniwob.t", "task_seed": 0, "attempt_idx": attempt},
                             [{"prompt": "p", "model_output": "noop()", "screenshot_hash": s.hash} for s in shots], shots)
    try:
        writer.flush()
        conn.send(("written", None))
    except LakeWriteError as e:
        conn.send(("not written", (str(e), e.episode_ids)))


def test_disk_full_reports_the_episodes_not_written_and_changes_nothing_stored(tmp_path, synthetic_lake):
    root = synthetic_lake.root
    before_files = lake_files(root)
    before_versions = synthetic_lake.versions()
    before_counts = step_counts(synthetic_lake)
    parent, child = SPAWN.Pipe()
    proc = SPAWN.Process(target=write_past_the_file_size_limit, args=(root, child))
    proc.start()
    assert parent.poll(120), "the writer did not report"
    outcome, detail = parent.recv()
    proc.join(60)
    assert proc.exitcode == 0
    assert outcome == "not written"
    message, episode_ids = detail
    assert episode_ids == [ids.episode_id("full-disk", "miniwob.t", 0, a) for a in range(4)]
    assert message.startswith("could not write 4 episode(s) to ")
    lake = Lake.open(root)
    assert lake.versions() == before_versions
    assert step_counts(lake) == before_counts
    after_files = lake_files(root)
    # files already stored are byte-for-byte unchanged; a partial data file may be left over but no commit names it
    assert {k: after_files.get(k) for k in before_files} == before_files
    assert not [k for k in after_files if k not in before_files and "_delta_log" in k]
    assert [str(p) for p in validate(lake)] == []


# ---------------------------------------------------------------------- bad inputs: one Error line, nothing changed
def make_newer_format(root: Path) -> None:
    info = json.loads((root / "meta" / "info.json").read_text())
    info["format_version"] += 1
    (root / "meta" / "info.json").write_text(json.dumps(info))


BAD_INPUTS = {
    "bad SQL": (["halo-data", "query", "selec count(*) from steps"], "Error: Parser Error: syntax error at or near \"selec\""),
    "writing statement": (["halo-data", "query", "delete from steps"], "Error: delete statements are not allowed"),
    "unknown view (export)": (["halo-data", "export", "no_such_view", "{tmp}/out.jsonl"], "Error: unknown view 'no_such_view'"),
    "unknown view (describe)": (["halo-data", "describe", "no_such_view"], "Error: unknown table or view 'no_such_view'"),
    "unknown view (query)": (["halo-data", "query", "select * from no_such_view"], "Error: unknown table or view 'no_such_view': tables are runs, steps"),
    "missing lake": (["halo-data", "query", "select 1", "--lake", "{tmp}/nowhere"], "Error: no HALO lake at {tmp}/nowhere"),
    "malformed import file": (["halo-data", "import", "{tmp}/old/bad.jsonl"], "Error: {tmp}/old/bad.jsonl:2: invalid JSON"),
    "unknown task id": (["halo-agent", "rollout", "--env", "miniwob", "--tasks", "miniwob.no-such-task", "--no-progress"],
                        "Error: unknown miniwob task 'miniwob.no-such-task': list them with `halo-agent tasks --env miniwob`"),
}


@pytest.fixture(scope="module")
def untouchable_lake(tmp_path_factory):
    """One small lake for every bad-input case: each case checks it is left byte-for-byte as it was."""
    from halo_data.synthetic import SyntheticSpec, build_synthetic_lake

    spec = SyntheticSpec(n_steps=300, attempts_per_task=3, min_steps=5, max_steps=10, screenshot_size=(32, 24), seed=11)
    return build_synthetic_lake(str(tmp_path_factory.mktemp("bad-inputs") / "lake"), spec)


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_error_line_and_changes_nothing(case, tmp_path, untouchable_lake):
    args, expected_start = BAD_INPUTS[case]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "bad.jsonl").write_text('{"type": "episode_start", "task_id": "t"}\n{"step": 0, "reward": }\n')
    root = untouchable_lake.root
    before = lake_files(root)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--lake" not in args:
        args += ["--lake", root]
    result = run_cli(*args)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(expected_start.replace("{tmp}", str(tmp_path))), lines[0]
    assert "Traceback" not in result.stderr
    assert lake_files(root) == before


def test_newer_format_version_is_refused_by_every_command_and_not_touched(tmp_path, synthetic_lake):
    root = Path(synthetic_lake.root)
    make_newer_format(root)
    before = lake_files(root)
    for args in (["halo-data", "query", "select 1"], ["halo-data", "compact"], ["halo-data", "validate"]):
        result = run_cli(*args, "--lake", str(root))
        assert result.returncode != 0
        assert result.stderr.startswith(f"Error: lake {root} has format version {S.FORMAT_VERSION + 1}, "
                                        f"this HALO reads up to {S.FORMAT_VERSION}: upgrade HALO")
        assert len(result.stderr.strip().splitlines()) == 1
    assert lake_files(root) == before


def test_truncated_parquet_file_is_found_by_validate(synthetic_lake):
    lake = synthetic_lake
    assert run_cli("halo-data", "validate", "--lake", lake.root).returncode == 0
    victim = Path(lake.files("steps")[0])
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    result = run_cli("halo-data", "validate", "--lake", lake.root)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: steps: unreadable file {victim}"), lines


# ---------------------------------------------------------------------- malformed model output
MALFORMED_OUTPUTS = ["I would click the big button", "click(", '{"action": "teleport"}']


class ChatCompletionsHandler(http.server.BaseHTTPRequestHandler):
    """Speaks OpenAI's chat-completions protocol, answering with outputs no parser accepts."""

    calls: list[dict] = []

    def log_message(self, *args):  # keep test output clean
        pass

    def _send(self, payload: dict, status: int = 200) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "garbled", "object": "model", "owned_by": "test"}]})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append({"path": self.path, "authorization": self.headers.get("Authorization"), "request": request})
        text = MALFORMED_OUTPUTS[len(type(self).calls) % len(MALFORMED_OUTPUTS)]
        n = int(request.get("n") or 1)
        self._send({
            "id": f"chatcmpl-{len(type(self).calls)}", "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model"),
            "choices": [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                         "logprobs": None} for i in range(n)],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })


@pytest.fixture
def garbling_server():
    ChatCompletionsHandler.calls = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ChatCompletionsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.browser
def test_malformed_model_output_is_an_invalid_action_and_the_episode_goes_on(tmp_path, garbling_server):
    root = tmp_path / "lake"
    url = f"http://127.0.0.1:{garbling_server.server_address[1]}/v1"
    result = run_cli("halo-agent", "rollout", "--env", "miniwob", "--tasks", "miniwob.click-checkboxes",
                     "--max-steps", "3", "--policy", "openai", "--model", "garbled", "--lake", str(root),
                     "--run-id", "garbled", "--no-progress", "--json", env={"HALO_VLLM_URL": url})
    assert result.returncode == 0, result.stderr
    assert ChatCompletionsHandler.calls, "the policy never called the endpoint"
    rows = Lake.open(root).query_arrow(
        "select step_idx, model_output, action, action_valid, parse_error, error from steps order by step_idx").to_pylist()
    assert [r["step_idx"] for r in rows] == [0, 1, 2]          # the episode went on after each bad output
    for r in rows:
        assert r["model_output"] in MALFORMED_OUTPUTS
        assert r["action_valid"] is False and r["action"] is None and r["parse_error"], r
        assert r["error"] is None                               # a wrong output is not an episode failure
