"""A LoRA training step of the real model under three OpenMP wait settings, alone and beside a neighbour, side by side.

    .venv/bin/python -m bench omp-wait                       # SmolLM2-135M-Instruct, 4 rows x 192 tokens, 2 rounds
    .venv/bin/python -m bench omp-wait --rounds 3 --steps 6
    .venv/bin/python -m bench omp-wait --work decode          # a chat server's decode step instead: 1 row, 300-token cache

A training job (``halo-train bc|dpo|grpo``, the online learner, the quickstart's BC) runs torch's OpenMP threads.
Left to libgomp's default, a thread that finishes its share of an operation spins (GOMP_SPINCOUNT, 300,000 by
default) while it waits for the others; where the cores are shared with a chat server, rollout workers and their
browsers, a spinning thread holds a core the thread it waits for needs. ``OMP_WAIT_POLICY=PASSIVE`` makes waiting
threads sleep at once; a short ``GOMP_SPINCOUNT`` spins briefly, then sleeps.

Each measurement is a fresh process (libgomp reads its settings when torch loads): SmolLM2-135M-Instruct with a
rank 16 LoRA on q, k, v and o, AdamW, ``--steps`` steps on ``--rows`` x ``--tokens`` token rows, the first taken
off as warm-up. Six arms, taken in turns round by round: libgomp's default, PASSIVE and ``--spincount``, each alone
and beside a neighbour, a second process doing what a chat server does while it serves rollouts (forward passes of
the same model on torch's default threads, PASSIVE as HALO's chat server runs) for as long as the measurement runs.
``--work decode`` measures a chat server's step instead: one new token per row on a KV cache of ``--tokens``.
Results go to ``bench/results/omp-wait/<time>.json``; ``python -m bench report omp-wait`` makes the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

# What both measured scripts start with (their arguments, the seed) and end with (their steps' seconds, as JSON).
HEAD = """
import json, os, sys, time
import torch
from transformers import AutoModelForCausalLM
model_dir, rows, tokens, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
"""
TAIL = """
print(json.dumps({"seconds": seconds, "threads": torch.get_num_threads()}))
"""

STEPS = HEAD + """
from peft import LoraConfig, get_peft_model
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                         task_type="CAUSAL_LM"))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
ids = torch.randint(0, model.config.vocab_size, (rows, tokens))
seconds = []
for _ in range(steps):
    wall, cpu = time.perf_counter(), time.process_time()
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    seconds.append([time.perf_counter() - wall, time.process_time() - cpu])
""" + TAIL

# A chat server's decode: one new token per row on a KV cache of the prompt, a step per token.
DECODE = HEAD + """
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
ids = torch.randint(0, model.config.vocab_size, (rows, tokens))
seconds = []
with torch.no_grad():
    out = model(input_ids=ids, use_cache=True)
    for _ in range(steps):
        wall, cpu = time.perf_counter(), time.process_time()
        out = model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
        seconds.append([time.perf_counter() - wall, time.process_time() - cpu])
""" + TAIL
WORK = {"train": (STEPS, 4, 192, 4), "decode": (DECODE, 1, 300, 64)}  # script, default rows, tokens, steps

# A chat server's work between requests: forward passes of the same model, waiting passively as HALO's server does.
NEIGHBOUR = """
import os, sys
import torch
from transformers import AutoModelForCausalLM
parent = os.getppid()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
ids = torch.randint(0, model.config.vocab_size, (2, 200))
print("ready", flush=True)
with torch.no_grad():
    while os.getppid() == parent:  # ends by itself once the benchmark is gone
        model(input_ids=ids)
"""

POLICIES = ("default", "passive", "spin")


def _env(policy: str, spincount: int = 0) -> dict[str, str]:
    """The environment of a measured process: libgomp's default, PASSIVE, or a short spin then sleep."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy == "passive":
        return env | {"OMP_WAIT_POLICY": "PASSIVE"}
    return env | ({"GOMP_SPINCOUNT": str(spincount)} if policy == "spin" else {})


def measure(script: str, model_dir: str, env: dict[str, str], beside: bool, rows: int, tokens: int, steps: int) -> dict:
    """One fresh process's steps of ``script`` in ``env``; with a neighbour running beside it when ``beside``."""
    neighbour = None
    try:
        if beside:
            neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, model_dir], env=_env("passive"),
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            if neighbour.stdout.readline().strip() != "ready":
                raise SystemExit("Error: the neighbour process did not start")
        done = subprocess.run([sys.executable, "-c", script, model_dir, str(rows), str(tokens), str(steps)],
                              env=env, capture_output=True, text=True, timeout=1800)
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    if done.returncode != 0:
        raise SystemExit(f"Error: a measurement failed:\n{done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench omp-wait", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a known model name (halo-train models) or a folder")
    ap.add_argument("--work", choices=sorted(WORK), default="train",
                    help="train: LoRA training steps; decode: a chat server's decode steps, a token per row")
    ap.add_argument("--rows", type=int, help="rows per step (train 4, decode 1)")
    ap.add_argument("--tokens", type=int, help="tokens per row (train 192; decode: the prompt's, 300)")
    ap.add_argument("--steps", type=int, help="steps per measurement, the first taken off as warm-up (train 4, decode 64)")
    ap.add_argument("--rounds", type=int, default=2, help="measurements per arm, the arms taking turns")
    ap.add_argument("--spincount", type=int, default=2000, help="GOMP_SPINCOUNT of the third policy: spin this long, then sleep")
    a = ap.parse_args(argv)
    script, rows, tokens, steps = WORK[a.work]
    a.rows, a.tokens, a.steps = a.rows or rows, a.tokens or tokens, a.steps or steps
    if a.steps < 2 or a.rounds < 1 or a.rows < 1 or a.tokens < 2:
        raise SystemExit("Error: --steps must be at least 2, --rounds and --rows at least 1, --tokens at least 2")
    from bench.reports import save
    from halo_agent.models import resolve_model

    model_dir = resolve_model(a.model)
    load_before = os.getloadavg()
    arms_order = [(policy, beside) for beside in (False, True) for policy in POLICIES]
    samples: dict[str, list[dict]] = {f"{policy}{'-beside' if beside else ''}": [] for policy, beside in arms_order}
    for round_ in range(a.rounds):
        for policy, beside in arms_order:
            name = f"{policy}{'-beside' if beside else ''}"
            got = measure(script, model_dir, _env(policy, a.spincount), beside, a.rows, a.tokens, a.steps)
            samples[name].append(got)
            walls = [w for w, _ in got["seconds"][1:]]
            print(f"round {round_ + 1} {name:16s} {statistics.median(walls):.4f} s per step ({got['threads']} threads)")

    def per_step(name: str, index: int) -> float:
        return statistics.median(s[index] for got in samples[name] for s in got["seconds"][1:])

    arms = {name: {"wall_per_step": round(per_step(name, 0), 5), "cpu_per_step": round(per_step(name, 1), 5),
                   "threads": got[0]["threads"], "samples": got} for name, got in samples.items()}
    ratios = {f"{policy}/default": {where: round(arms[policy + suffix]["wall_per_step"] / arms["default" + suffix]["wall_per_step"], 2)
                                    for where, suffix in (("alone", ""), ("beside", "-beside"))}
              for policy in POLICIES[1:]}
    for key, ratio in ratios.items():
        print(f"{key}, seconds per step: alone {ratio['alone']}x, beside a neighbour {ratio['beside']}x")
    out = save("omp-wait", {"work": a.work, "model": a.model, "rows": a.rows, "tokens": a.tokens, "steps": a.steps, "rounds": a.rounds,
                            "spincount": a.spincount,
                            "arms": arms, "ratios": ratios, "load_before": load_before, "load_after": os.getloadavg()},
               argv if argv is not None else sys.argv[2:])
    print(f"results: {out}")


if __name__ == "__main__":
    main()
