"""``halo-train serve``: the vLLM command line for a GPU host, and on CPU a real chat server started, queried and stopped."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from halo_train import serve
from halo_train.cli import main


def adapter(folder: Path, r: int, rank_pattern: dict | None = None) -> str:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "rank_pattern": rank_pattern or {}, "peft_type": "LORA"}))
    return str(folder)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_the_vllm_command_line_enables_runtime_lora_with_room_for_a_swap(tmp_path):
    a = adapter(tmp_path / "a", 8)
    b = adapter(tmp_path / "b", 8, {"model.layers.0.self_attn.q_proj": 24})
    result = invoke("serve", "--engine", "vllm", "--dry-run", "--base-model", "Qwen/Qwen2.5-0.5B-Instruct",
                    "--adapters", f"bc={a}", f"dpo={b}", "--port", "8100", "--host", "0.0.0.0",
                    "--vllm-args", "--max-model-len 4096 --gpu-memory-utilization 0.8")
    assert result.exit_code == 0, result.output
    assert result.output == (
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve Qwen/Qwen2.5-0.5B-Instruct --host 0.0.0.0 --port 8100 "
        f"--enable-lora --max-loras 3 --max-lora-rank 32 --logprobs-mode processed_logprobs --generation-config vllm --lora-modules bc={a} dpo={b} "
        "--max-model-len 4096 --gpu-memory-utilization 0.8\n"
    )
    spec = serve.ServeSpec("base", {}, engine="vllm")
    name, command, env = serve.engine_process(spec)
    assert (name, env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]) == ("vllm", "True")
    assert command[command.index("--max-lora-rank") + 1] == "16" and command[command.index("--max-loras") + 1] == "1"


@pytest.mark.parametrize("ranks, expected", [([4], 8), ([8, 16], 16), ([17], 32), ([300], 320), ([512], 512)])
def test_max_lora_rank_is_the_smallest_rank_vllm_accepts(ranks, expected):
    assert serve.vllm_max_lora_rank(ranks) == expected


@pytest.mark.parametrize("args, message", [
    (["--adapters", "noequals"], "Error: --adapters takes NAME=DIR, got 'noequals'\n"),
    (["--adapters", "x=/no/such/dir"], "Error: /no/such/dir is not a PEFT adapter folder (no adapter_config.json): pass OUTPUT_DIR/final\n"),
    (["--host", "0.0.0.0", "--engine", "chat"], "Error: HALO's chat server listens on 127.0.0.1 only, not 0.0.0.0: serve other machines with vLLM\n"),
    (["stray=dir"], "Error: unexpected argument 'stray=dir': adapters follow --adapters\n"),
])
def test_bad_input_is_one_error_line(tmp_path, args, message):
    result = invoke("serve", "--base-model", "models/tiny", "--dry-run", *args)
    assert (result.exit_code, result.output) == (1, message)


def test_a_rank_vllm_cannot_serve_is_refused(tmp_path):
    big = adapter(tmp_path / "big", 1024)
    result = invoke("serve", "--engine", "vllm", "--dry-run", "--base-model", "b", "--adapters", f"big={big}")
    assert (result.exit_code, result.output) == (1, "Error: an adapter has LoRA rank 1024: vLLM serves ranks up to 512\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chat(url: str, model: str) -> dict:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Click OK."}], "max_tokens": 4,
                       "temperature": 0}).encode()
    request = urllib.request.Request(f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_serve_on_cpu_answers_with_the_adapter_and_stop_ends_only_it(tiny_lora_models, tmp_path):
    base, adapters = tiny_lora_models
    port, state_dir = _free_port(), str(tmp_path / "state")
    result = invoke("serve", "--base-model", base, "--adapters", f"bc={adapters['policy-1']}", "--port", str(port),
                    "--state-dir", state_dir, "--wait", "120")
    assert result.exit_code == 0, result.output
    url = f"http://127.0.0.1:{port}/v1"
    lines = result.output.splitlines()
    assert re.fullmatch(rf"serving {re.escape(base)} with chat at {url} \(adapters: bc; pid \d+, log .+\)", lines[0])
    assert lines[1] == f"export HALO_VLLM_URL={url}"
    assert lines[2].endswith(f"serve --stop --port {port} --state-dir {state_dir}")
    state = json.loads((Path(state_dir) / f"{port}.json").read_text())
    pid = state["pid"]

    answer = _chat(url, "bc")
    assert answer["model"] == "bc" and answer["choices"][0]["message"]["content"] is not None
    # a second serve on the same port is refused while the first runs
    again = invoke("serve", "--base-model", base, "--port", str(port), "--state-dir", state_dir)
    assert again.exit_code == 1 and f"port {port} is already served by pid {pid} (chat)" in again.output

    # the printed stop line runs as printed
    stop = subprocess.run(lines[2].split(": ", 1)[1], shell=True, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout == f"stopped chat (pid {pid}) serving {url}\n"
    assert serve._proc_start_time(pid) is None and not (Path(state_dir) / f"{port}.json").exists()
    gone = invoke("serve", "--stop", "--port", str(port), "--state-dir", state_dir)
    assert gone.exit_code == 1 and gone.output.startswith(f"Error: nothing to stop: halo-train serve started no engine on port {port}")


def test_stop_leaves_a_process_that_reused_the_pid_alone(tmp_path):
    """A state file whose pid now belongs to another process (another start time) stops nothing."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state_dir = tmp_path / "state"
        state_dir.mkdir()
        (state_dir / "8123.json").write_text(json.dumps({
            "pid": other.pid, "start_time": "1", "command": serve._proc_cmdline(other.pid), "engine": "chat",
            "url": "http://127.0.0.1:8123/v1"}))
        result = invoke("serve", "--stop", "--port", "8123", "--state-dir", str(state_dir))
        assert (result.exit_code, result.output) == (
            0, f"pid {other.pid} is no longer the engine started on port 8123: nothing stopped, state removed\n")
        assert other.poll() is None and not (state_dir / "8123.json").exists()
    finally:
        other.kill()
        other.wait()
