"""``halo-train serve``: start the engine a policy is served by, in the background, and stop exactly that one.

    halo-train serve --base-model Qwen/Qwen2.5-3B-Instruct --adapters bc=out/bc/final --port 8000
    export HALO_VLLM_URL=http://127.0.0.1:8000/v1
    halo-train serve --stop --port 8000

On a GPU host with the ``vllm`` command installed (``--engine auto``) it runs ``vllm serve``
with LoRA enabled, runtime LoRA updating on (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``: online
GRPO swaps adapters without a restart), ``--max-loras`` with room for one swap and
``--max-lora-rank`` from the adapters' own ranks. Elsewhere it runs HALO's chat server, which
answers the same routes. Either way it waits until the engine lists its models, then records
the process (pid, start time, command line) in a state file per port; ``--stop`` ends that
process group only if the pid still belongs to the process it started. ``running`` does the
same for the length of a ``with`` block (``halo-train online-grpo --serve``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from halo_data.lake import LakeError

log = logging.getLogger(__name__)

# The ranks vLLM accepts for --max-lora-rank (its LoRAConfig's MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_STATE_DIR = Path("~/.cache/halo/serve")
ENGINES = ("auto", "vllm", "chat")


class ServeError(LakeError):
    """A serve or stop that cannot go on; the CLI prints it as one ``Error: ...`` line."""


@dataclasses.dataclass(frozen=True)
class ServeSpec:
    base_model: str
    adapters: dict[str, str]
    port: int = 8000
    host: str = "127.0.0.1"
    engine: str = "auto"
    extra_args: tuple[str, ...] = ()
    # vLLM: adapters loaded at runtime on top of the preloaded ones (online GRPO loads RUN-policy-{v+1} before it
    # unloads RUN-policy-{v}: 2), and the LoRA ranks they may have (a fresh adapter's --lora-r, a warm start's r).
    runtime_loras: int = 1
    runtime_ranks: tuple[int, ...] = ()

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}/v1"


def parse_adapters(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``NAME=DIR`` pairs to ``{name: absolute dir}``; every DIR must be a PEFT adapter folder."""
    adapters: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ServeError(f"--adapters takes NAME=DIR, got {item!r}")
        if name in adapters:
            raise ServeError(f"adapter name {name!r} given twice")
        folder = Path(path).expanduser()
        if not (folder / "adapter_config.json").is_file():
            raise ServeError(f"{path} is not a PEFT adapter folder (no adapter_config.json): pass OUTPUT_DIR/final")
        adapters[name] = str(folder.resolve())
    return adapters


def adapter_rank(folder: str) -> int:
    """The largest LoRA rank in an adapter folder (its ``r`` and any per-module ``rank_pattern``)."""
    config = json.loads((Path(folder) / "adapter_config.json").read_text())
    ranks = [int(config.get("r") or 0), *map(int, (config.get("rank_pattern") or {}).values())]
    return max(ranks)


def vllm_max_lora_rank(ranks: list[int]) -> int:
    """The smallest rank vLLM accepts that holds every adapter's (16, vLLM's default, with none)."""
    need = max(ranks, default=16)
    for allowed in VLLM_LORA_RANKS:
        if allowed >= need:
            return allowed
    raise ServeError(f"an adapter has LoRA rank {need}: vLLM serves ranks up to {VLLM_LORA_RANKS[-1]}")


def vllm_command(spec: ServeSpec, executable: str = "vllm") -> list[str]:
    """``vllm serve`` with LoRA on: the adapters preloaded, and room for ``runtime_loras`` more loaded at runtime;
    logprobs of the distribution each token was drawn from (``--logprobs-mode processed_logprobs``, what the
    ``openai`` policy records for vLLM and HALO's chat server reports), and vLLM's own default sampling
    parameters (``--generation-config vllm``), not those of the model's generation_config.json, which vLLM
    otherwise applies to every request that does not name them (``auto``; Qwen2.5-Instruct's
    repetition_penalty 1.05, top_k 20, top_p 0.8): unless ``extra_args`` say otherwise. The ``openai`` policy
    also sends every sampling field at its neutral value (``openai_policy.NEUTRAL_SAMPLING``).

    The one place HALO builds vLLM's command line (``halo-train serve`` and ``online-grpo --serve``); it runs
    with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (``engine_process``).
    """
    ranks = [adapter_rank(path) for path in spec.adapters.values()] + [int(r) for r in spec.runtime_ranks]
    command = [executable, "serve", spec.base_model, "--host", spec.host, "--port", str(spec.port), "--enable-lora",
               "--max-loras", str(len(spec.adapters) + spec.runtime_loras), "--max-lora-rank", str(vllm_max_lora_rank(ranks))]
    for flag, value in (("--logprobs-mode", "processed_logprobs"), ("--generation-config", "vllm")):
        if not any(a == flag or a.startswith(flag + "=") for a in spec.extra_args):
            command += [flag, value]
    if spec.adapters:
        command += ["--lora-modules", *(f"{name}={path}" for name, path in spec.adapters.items())]
    return command + list(spec.extra_args)


def chat_server_command(base_model: str, adapters: dict[str, str], port: int, parent_pid: int | None = None) -> list[str]:
    """HALO's CPU chat server (``halo_agent.chat_server``) on 127.0.0.1; with ``parent_pid``, it stops once that
    process has ended."""
    command = [sys.executable, "-m", "halo_agent.chat_server", "--model", str(base_model), "--port", str(port), "--device", "cpu"]
    if adapters:
        command += ["--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
    if parent_pid is not None:
        command += ["--parent-pid", str(parent_pid)]
    return command


def vllm_executable() -> str | None:
    """The ``vllm`` command: on PATH, or beside this interpreter (a virtual environment not on PATH); None without one."""
    beside = Path(sys.executable).parent / "vllm"
    return shutil.which("vllm") or (str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None)


def vllm_missing() -> str | None:
    """Why vLLM cannot serve here (no ``vllm`` command, no CUDA GPU), or None where it can."""
    if vllm_executable() is None:
        return "no vllm command on PATH (pip install vllm on a GPU host)"
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    return None


def pick_engine(requested: str) -> str:
    """``vllm`` where its command is installed and a GPU is present (``auto``), else HALO's chat server."""
    if requested != "auto":
        return requested
    return "vllm" if vllm_missing() is None else "chat"


def check_engine(engine: str) -> None:
    """One line when the chosen engine cannot run here (vLLM without its command or a GPU)."""
    why = vllm_missing() if engine == "vllm" else None
    if why:
        raise ServeError(f"--engine vllm cannot run here: {why}; use --engine chat (HALO's chat server on CPU)")


def engine_process(spec: ServeSpec, parent_pid: int | None = None) -> tuple[str, list[str], dict[str, str]]:
    """The engine chosen, its command line and its environment; with ``parent_pid``, HALO's chat server stops once
    that process has ended."""
    engine = pick_engine(spec.engine)
    if engine == "vllm":
        return engine, vllm_command(spec), {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    if spec.host != "127.0.0.1":
        raise ServeError(f"HALO's chat server listens on 127.0.0.1 only, not {spec.host}: serve other machines with vLLM")
    if spec.extra_args:
        raise ServeError("extra engine arguments are for vllm serve; HALO's chat server takes none")
    return engine, chat_server_command(spec.base_model, spec.adapters, spec.port, parent_pid=parent_pid), dict(os.environ)


# ------------------------------------------------------------------------------ process identity
def _proc_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def _proc_cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


def state_file(state_dir: str | os.PathLike[str], port: int) -> Path:
    return Path(state_dir).expanduser() / f"{port}.json"


def _is_ours(state: dict) -> bool:
    """The recorded pid is still the process started then: same start time, same command line."""
    pid = int(state["pid"])
    return _proc_start_time(pid) == state["start_time"] and _proc_cmdline(pid) == state["command"]


# ------------------------------------------------------------------------------ start / stop
def start(spec: ServeSpec, state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR, wait: float = 600.0) -> dict:
    """Start the engine in its own process group, wait until it serves, record it; returns the state."""
    from halo_agent.serving import EngineClient, EngineError

    path = state_file(state_dir, spec.port)
    if path.exists():
        state = json.loads(path.read_text())
        if _is_ours(state):
            raise ServeError(f"port {spec.port} is already served by pid {state['pid']} ({state['engine']}): "
                             f"stop it with `halo-train serve --stop --port {spec.port}` first")
        path.unlink()
    if EngineClient(spec.url).ready():
        raise ServeError(f"something already answers at {spec.url}: choose another --port")
    path.parent.mkdir(parents=True, exist_ok=True)
    proc, state = _launch(spec, path.with_suffix(".log"))
    path.write_text(json.dumps(state, indent=2))
    try:
        _wait_serving(proc, state, wait)
    except ServeError:
        path.unlink(missing_ok=True)
        raise
    client = EngineClient(spec.url)
    try:
        names = sorted(client.models())
    except EngineError as e:
        raise ServeError(str(e)) from None
    missing = sorted(set(spec.adapters) - set(names))
    if missing:
        log.warning("the engine does not list adapter(s) %s", ", ".join(missing))
    return {**state, "models": names}


def _launch(spec: ServeSpec, log_path: Path, tied: bool = False) -> tuple[subprocess.Popen, dict]:
    """Start the engine ``spec`` picks in its own process group, its output in ``log_path``; the process and its state.
    ``tied``: the chat server ends with this process, even one killed with -9."""
    engine, command, env = engine_process(spec, parent_pid=os.getpid() if tied else None)
    check_engine(engine)
    if engine == "vllm":
        command = [vllm_executable() or command[0], *command[1:]]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    state = {"pid": proc.pid, "start_time": _proc_start_time(proc.pid), "command": command, "engine": engine,
             "url": spec.url, "base_model": spec.base_model, "adapters": spec.adapters, "log": str(log_path)}
    return proc, state


def _wait_serving(proc: subprocess.Popen, state: dict, wait: float) -> None:
    """Block until the engine lists its models (GET /v1/models); if it exits or ``wait`` runs out, end it and say why."""
    from halo_agent.serving import EngineClient

    client = EngineClient(state["url"])
    deadline = time.monotonic() + wait
    while not client.ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            _end(state)
            proc.poll()
            tail = Path(state["log"]).read_text(errors="replace").strip().splitlines()
            why = tail[-1] if tail else f"exit code {proc.returncode}"
            raise ServeError(f"{state['engine']} did not start serving at {state['url']} ({why}); its log is {state['log']}")
        time.sleep(0.5)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the engine binds it moments later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(spec: ServeSpec, log_path: Path, wait: float = 600.0) -> Iterator[dict]:
    """The engine for the length of a ``with`` block: started in its own process group, waited for until it
    serves, and that process group ended at the end (SIGTERM, then SIGKILL), whatever ends the block. A process
    killed with -9 runs no ``finally``: HALO's chat server then stops by itself once its parent is gone; a vLLM
    engine is left to ``kill`` by the pid its log and the caller's record name."""
    proc, state = _launch(spec, Path(log_path), tied=True)
    try:
        _wait_serving(proc, state, wait)
        yield state
    finally:
        # The leader is not reaped before the group is ended, so its pid (the group id) cannot have been reused.
        _end(state)
        proc.wait()


def stop(port: int, state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR, wait: float = 30.0) -> str:
    """End the engine ``start`` recorded for ``port``; a line saying what was done."""
    path = state_file(state_dir, port)
    if not path.exists():
        raise ServeError(f"nothing to stop: halo-train serve started no engine on port {port} (no {path})")
    state = json.loads(path.read_text())
    if not _is_ours(state):
        path.unlink()
        return f"pid {state['pid']} is no longer the engine started on port {port}: nothing stopped, state removed"
    _end(state, wait)
    path.unlink()
    return f"stopped {state['engine']} (pid {state['pid']}) serving {state['url']}"


def _end(state: dict, wait: float = 30.0) -> None:
    """SIGTERM the engine's process group (vLLM runs its engine core in child processes), SIGKILL if it lingers."""
    pid = int(state["pid"])
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while _proc_start_time(pid) == state["start_time"] and time.monotonic() < deadline:
            time.sleep(0.2)
        if _proc_start_time(pid) != state["start_time"]:
            return
