"""No lake file holds a secret: rollouts run with an API key and a credentialed endpoint URL set.

The check reads every byte of every file under the lake — the Delta logs and
meta/info.json as they are, and each Parquet file both as raw bytes and decoded
(its columns are zstd-compressed, so a raw grep alone could miss a stored value).
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from halo_data.lake import Lake

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


class ChatCompletions(http.server.BaseHTTPRequestHandler):
    """A local endpoint speaking OpenAI's chat-completions protocol; remembers what auth it was sent."""

    authorizations: list[str | None] = []

    def log_message(self, *args):
        pass

    def _send(self, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "local-model", "object": "model", "owned_by": "test"}]})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).authorizations.append(self.headers.get("Authorization"))
        self._send({
            "id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": request.get("model"),
            "choices": [{"index": i, "message": {"role": "assistant", "content": "scroll(0, 200)"}, "finish_reason": "stop",
                         "logprobs": None} for i in range(int(request.get("n") or 1))],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })


@pytest.fixture
def endpoint():
    ChatCompletions.authorizations = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ChatCompletions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def parquet_values(path: Path):
    """Every string and binary value of a Parquet file, and its key-value metadata."""
    f = pq.ParquetFile(path)
    for k, v in (f.metadata.metadata or {}).items():
        yield k
        yield v
    table = f.read()
    for column in table.columns:
        t = column.type
        if pa.types.is_list(t):
            t = t.value_type
            column = pa.chunked_array([c.flatten() for c in column.chunks], t)
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            for v in column.to_pylist():
                if v is not None:
                    yield v.encode() if isinstance(v, str) else v


def files_containing(root: Path, needles: list[bytes]) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        hits = [n for n in needles if n in data]
        if path.suffix == ".parquet":
            for value in parquet_values(path):
                hits += [n for n in needles if n in value]
        if hits:
            found.append(f"{path.relative_to(root)}: {sorted(set(hits))}")
    return found


def test_the_scan_finds_a_secret_in_a_parquet_column_and_in_a_log_file(tmp_path):
    needle = ("sk-halo" + secrets.token_hex(16)).encode()
    rows = [f"run {i} --key {needle.decode()}" for i in range(200)]
    pq.write_table(pa.table({"command": rows}), tmp_path / "x.parquet", compression="zstd")
    (tmp_path / "_delta_log").mkdir()
    (tmp_path / "_delta_log" / "0.json").write_text(json.dumps({"commitInfo": {"key": needle.decode()}}))
    (tmp_path / "clean.json").write_text("{}")
    assert files_containing(tmp_path, [needle]) == [f"_delta_log/0.json: {[needle]}", f"x.parquet: {[needle]}"]


@pytest.mark.browser
@pytest.mark.slow
def test_no_lake_file_contains_the_api_key_or_the_endpoint_password(tmp_path, endpoint):
    api_key = "sk-halo" + secrets.token_hex(16)
    password = "pw" + secrets.token_hex(12)
    vllm_url = f"http://halo-user:{password}@127.0.0.1:{endpoint}/v1"
    env = {**os.environ, "OPENAI_API_KEY": api_key, "HALO_VLLM_URL": vllm_url}
    lake = tmp_path / "lake"
    common = ["rollout", "--env", "miniwob", "--tasks", "miniwob.click-checkboxes", "--max-steps", "2",
              "--lake", str(lake), "--no-progress", "--json"]
    runs = {
        # the random policy, with the key also passed on the command line as a policy option
        "random": common + ["--run-id", "secret-random", "--policy-option", f"api_key={api_key}"],
        # the openai policy, which really sends the key to the endpoint named by HALO_VLLM_URL
        "openai": common + ["--run-id", "secret-openai", "--policy", "openai", "--model", "local-model"],
    }
    for name, args in runs.items():
        result = subprocess.run([str(BIN / "halo-agent"), *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=180)
        assert result.returncode == 0, (name, result.stderr[-2000:])
        assert api_key not in result.stdout
    # the endpoint URL's credentials were in use: the client sent them as basic auth (they take precedence over the key)
    basic = base64.b64encode(f"halo-user:{password}".encode()).decode()
    assert ChatCompletions.authorizations and set(ChatCompletions.authorizations) == {f"Basic {basic}"}

    l = Lake.open(lake)
    rows = l.query_arrow("select run_id, command, config, provenance from runs order by run_id").to_pylist()
    assert [r["run_id"] for r in rows] == ["secret-openai", "secret-random"]
    assert l.query_arrow("select count(*) from steps where run_id = 'secret-openai' and model_output is not null").column(0)[0].as_py() > 0
    assert files_containing(lake, [api_key.encode(), password.encode(), vllm_url.encode(), basic.encode()]) == []
