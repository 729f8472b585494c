"""First-update importance ratios: the rows an engine serves, scored by the GRPO trainer before any update.

    .venv/bin/python -m bench ratios --engine server                 # HALO's chat server, a tiny model: seconds on CPU
    .venv/bin/python -m bench ratios --engine hf                     # transformers' generate (HFPolicy)
    python -m bench ratios --engine vllm --model /models/Qwen2.5-0.5B-Instruct   # vLLM on a GPU, as halo-train serve starts it

Each engine answers the same prompts (a page of buttons and links, rendered by ``halo_data.prompts``) through the
policy HALO collects with (``openai`` against a server, ``hf`` in process): plain sampling and greedy, and, on a
server, guided choices among the page's actions (``structured_outputs.choice``) at a temperature and greedy. Every
stored row is then scored as ``halo-train grpo`` scores it (``halo_train.grpo_loss.behaviour_token_logps``: the stored
ids under the distribution the row names) by the base model in eval mode, in float32 and, on a GPU, in the
training dtype (bf16). Per draw: tokens, max / p99 / median |ratio - 1| per token, the sequence log-ratios, and
``halo_train.behaviour.truncated_importance_weight``'s gap statistics (the share of tokens a cap of 2 would
truncate). On CPU with HALO's engines every ratio is 1 to float rounding (< 1e-4); vLLM's bf16 kernels are
expected not to be, which is what the numbers measure. ``--model`` defaults to a tiny model built in a temporary
folder (``halo_train.tiny_model``); ``--generation-config`` writes sampling defaults into a copy of the model's
generation_config.json (as Qwen2.5-Instruct ships them) to show they do not leak. The result is printed and
written to ``bench/results/ratios/<engine>-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QWEN_DEFAULTS = {"do_sample": True, "temperature": 0.7, "repetition_penalty": 1.05, "top_k": 20, "top_p": 0.8}
PAGES = [("Click the Submit button.", [("12", "button", "Submit"), ("13", "link", "Tab #2"), ("14", "button", "Cancel")]),
         ("Open the second tab.", [("21", "tab", "Tab #1"), ("22", "tab", "Tab #2"), ("23", "button", "Search")]),
         ("Press Cancel.", [("31", "button", "OK"), ("32", "button", "Cancel"), ("33", "link", "Home")])]


def observations():
    from halo_agent.types import Element, Observation
    from halo_data import prompts

    for i, (goal, elements) in enumerate(PAGES):
        page = prompts.elements_text((bid, role, name) for bid, role, name in elements)
        messages = prompts.render_messages(goal, "http://localhost/page", page, goal_last=True)
        yield Observation(goal=goal, url="http://localhost/page", axtree=page,
                          elements=tuple(Element(bid, role, name, "click") for bid, role, name in elements),
                          screenshot=None, screenshot_hash=None, messages=messages, history=(), step_idx=i,
                          task_id="bench.ratios", extra={})


def collect(policy, temperature: float, rows: list[dict], label: str) -> None:
    from halo_data import prompts

    for obs in observations():
        policy.act(obs)
        for s in policy.last_samples:
            if s.completion_token_ids and s.logprobs:
                rows.append({"label": label, "prompt": prompts.dumps(obs.messages), "completion": s.model_output,
                             "completion_token_ids": s.completion_token_ids, "logprobs": s.logprobs,
                             "logprobs_mode": s.logprobs_mode, "draw": s.draw, "choices": s.choices,
                             "temperature": temperature})


def served_rows(url: str, model_name: str, args) -> list[dict]:
    from halo_agent.policies.openai_policy import OpenAIPolicy

    rows: list[dict] = []
    for constrain in (False, True):
        for temperature in (args.temperature, 0.0):
            policy = OpenAIPolicy(model=model_name, base_url=url, temperature=temperature, max_tokens=args.max_tokens,
                                  n=args.n if temperature else 1, constrain_actions=constrain, seed=args.seed)
            label = ("guided " if constrain else "") + ("greedy" if temperature == 0 else "sampled")
            collect(policy, temperature, rows, label)
            policy.close()
    return rows


def hf_rows(model: str, args) -> list[dict]:
    from halo_agent.policies.hf_policy import HFPolicy

    rows: list[dict] = []
    for temperature in (args.temperature, 0.0):
        policy = HFPolicy(model=model, temperature=temperature, n=args.n if temperature else 1,
                          max_new_tokens=args.max_tokens, seed=args.seed)
        collect(policy, temperature, rows, "greedy" if temperature == 0 else "sampled")
    return rows


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))] if ordered else float("nan")


def score(model_dir: str, rows: list[dict], dtype_name: str) -> dict[str, dict]:
    """Per label: the trainer's first-update token ratios against the stored logprobs, summarised."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_train.behaviour import truncated_importance_weight
    from halo_train.grpo import behaviour_token_logps, pad_members, tokenize_member

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype_name)).to(device).eval()
    out = {}
    for label in dict.fromkeys(r["label"] for r in rows):
        of_label = [r for r in rows if r["label"] == label]
        gaps, sequences, truncated, tokens = [], [], 0.0, 0
        for start in range(0, len(of_label), 8):
            chunk = of_label[start:start + 8]
            batch = pad_members([tokenize_member(tokenizer, r["prompt"], r["completion"], 512, r) for r in chunk],
                                tokenizer.pad_token_id)
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                token_logps, mask = behaviour_token_logps(model, batch)
            log_ratio = (token_logps - batch["token_logprobs"]) * mask
            gaps += log_ratio[mask.bool()].abs().tolist()
            sequences += log_ratio.sum(-1).tolist()
            _, stats = truncated_importance_weight(token_logps, batch["token_logprobs"], mask)
            n = int(mask.sum())
            truncated += stats["engine_tis_truncated"] * n
            tokens += n
        ratio_gaps = [math.expm1(g) for g in gaps]
        out[label] = {"rows": len(of_label), "tokens": tokens, "max_abs_ratio_minus_1": max(ratio_gaps, default=0.0),
                      "p99_abs_ratio_minus_1": quantile(ratio_gaps, 0.99), "median_abs_ratio_minus_1": quantile(ratio_gaps, 0.5),
                      "max_abs_sequence_log_ratio": max(map(abs, sequences), default=0.0),
                      "tis_truncated_share_cap_2": truncated / tokens if tokens else 0.0}
    return out


def with_generation_config(model: str, folder: Path) -> str:
    """A copy of ``model``'s folder (its files linked) whose generation_config.json carries Qwen2.5's defaults."""
    source = Path(model)
    folder.mkdir(parents=True)
    for f in source.iterdir():
        if f.name != "generation_config.json":
            (folder / f.name).symlink_to(f.resolve())
    config = json.loads((source / "generation_config.json").read_text()) if (source / "generation_config.json").exists() else {}
    (folder / "generation_config.json").write_text(json.dumps({**config, **QWEN_DEFAULTS}))
    return str(folder)


def main(argv: list[str] | None = None) -> None:
    from halo_agent.policies.linear_kernels import LINEAR_KERNELS

    parser = argparse.ArgumentParser(prog="python -m bench ratios", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("server", "hf", "vllm"), default="server")
    parser.add_argument("--model", default=None, help="a local model folder or a known name such as smollm2-135m-instruct "
                        "(default: a tiny model built in a temporary folder)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt at the temperature")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--generation-config", action="store_true",
                        help="serve a copy of the model whose generation_config.json sets Qwen2.5-Instruct's sampling defaults")
    parser.add_argument("--linear-kernel", choices=LINEAR_KERNELS, default="auto",
                        help="the chat server's CPU linear kernel (--engine server), as its --linear-kernel")
    parser.add_argument("--vllm-args", default="", help="more options for vllm serve, e.g. '--max-model-len 4096'")
    parser.add_argument("--out", default=None, help="where to write the JSON (default bench/results/ratios/)")
    args = parser.parse_args(argv)
    import torch

    with tempfile.TemporaryDirectory(prefix="halo-ratios-") as tmp:
        model = args.model
        if model is None:
            from halo_train.tiny_model import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny"))
        else:
            from halo_agent.models import ModelResolveError, resolve_model

            try:
                model = resolve_model(model)  # a known model's name (smollm2-135m-instruct) → its converted folder
            except ModelResolveError as e:
                sys.exit(f"Error: {e}")
            if not Path(model).is_dir():
                sys.exit(f"Error: --model {model} is not a folder: pass a local model folder or a known name (no hub downloads)")
        if args.generation_config:
            model = with_generation_config(model, Path(tmp) / "model")
        started = time.perf_counter()
        if args.engine == "hf":
            rows = hf_rows(model, args)
        elif args.engine == "server":
            from halo_agent.chat_server import ChatCompletionServer
            from halo_agent.policies.hf_policy import LocalChatModel

            engine = LocalChatModel(model, device="auto", linear_kernel=args.linear_kernel)
            with ChatCompletionServer(engine, served_model_name="policy") as server:
                rows = served_rows(server.url, "policy", args)
        else:
            import shlex

            from halo_train.serve import ServeSpec, free_port, running, vllm_missing

            missing = vllm_missing()
            if missing:
                sys.exit(f"Error: vLLM cannot serve here: {missing}")
            spec = ServeSpec(model, {}, port=free_port(), engine="vllm", extra_args=tuple(shlex.split(args.vllm_args)))
            with running(spec, Path(tmp) / "vllm.log", wait=900):
                rows = served_rows(spec.url, model, args)
        collected = time.perf_counter() - started
        dtypes = ["float32"] + (["bfloat16"] if torch.cuda.is_available() else [])
        import os

        from bench.reports import head_commit

        result = {"engine": args.engine, "model": args.model or "tiny (built)", "generation_config": args.generation_config,
                  "linear_kernel": engine.linear_kernel if args.engine == "server" else None, "commit": head_commit(),
                  "load_average": round(os.getloadavg()[0], 1), "argv": sys.argv[1:] if argv is None else argv,
                  "temperature": args.temperature, "rows": len(rows), "collect_seconds": round(collected, 1),
                  "by_dtype": {d: score(model, rows, d) for d in dtypes}}
    text = json.dumps(result, indent=2)
    print(text)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / "ratios" / f"{args.engine}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(f"written to {out}", file=sys.stderr)
    if args.engine != "vllm" and result["by_dtype"]["float32"]:
        worst = max(v["max_abs_ratio_minus_1"] for v in result["by_dtype"]["float32"].values())
        if worst >= 1e-4:
            sys.exit(f"Error: a first-update ratio is {1 + worst:.6f} on {args.engine}, where HALO's engines should give 1")


if __name__ == "__main__":
    main()
