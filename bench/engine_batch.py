"""What a batched choice-walk step would cost: one decode forward of the served model at batch 1, 2, 4, ...

    .venv/bin/python -m bench engine-batch                       # smollm2-135m-instruct, a 500-token prompt
    .venv/bin/python -m bench engine-batch --prompt-tokens 300 --batches 1,2,4,8

HALO's chat server walks a guided choice token by token (``ChoiceWalk``): wherever the mask allows more than one
token it runs one forward of the tokens since the last place computed, continuing from the prompt's KV cache.
The engine batches the prefills of requests that arrive together, but each walk still runs alone, one request
after another. On a CPU a small model's decode forward is bound by reading its weights, so a forward of B walks'
tokens may cost far less than B forwards of one. This measures it: the same decode forward (one new token after
``--prompt-tokens`` tokens of cache, each row its own cache) at every batch size in ``--batches``, ``--repeats``
times each, interleaved round by round so every batch size meets the same machine, with the engine's thread count.

Printed and written to bench/results/engine-batch/<time>.json: the median milliseconds per forward at each batch
size, and its cost per walk relative to batch 1 (below 1: batching pays). A measurement, never a timed test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.reports import save


def measure(model_name: str, prompt_tokens: int, batches: list[int], repeats: int, threads: int | None, seed: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from halo_agent.models import resolve_model

    if threads:
        torch.set_num_threads(threads)
    path = resolve_model(model_name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    widest = max(batches)
    with torch.inference_mode():
        prompts = torch.randint(0, vocab, (widest, prompt_tokens), generator=generator)
        layers = [(layer.keys, layer.values) for layer in model(input_ids=prompts, use_cache=True).past_key_values.layers]

        def forward(batch: int) -> float:
            # each row continues from its own prompt's cache, as each walk does from its own request's prompt
            cache = DynamicCache([(k[:batch].clone(), v[:batch].clone()) for k, v in layers])
            tokens = torch.randint(0, vocab, (batch, 1), generator=generator)
            started = time.perf_counter()
            model(input_ids=tokens, cache=cache, use_cache=True, logits_to_keep=1)
            return time.perf_counter() - started

        for batch in batches:  # warm-up: first calls allocate
            forward(batch)
        seconds: dict[int, list[float]] = {b: [] for b in batches}
        for _ in range(repeats):
            for batch in batches:
                seconds[batch].append(forward(batch))
    one = statistics.median(seconds[batches[0]]) / batches[0]
    return {
        "model": model_name,
        "model_path": path,
        "torch_threads": torch.get_num_threads(),
        "prompt_tokens": prompt_tokens,
        "batches": {
            str(b): {
                "median_ms": statistics.median(s) * 1000,
                "min_ms": min(s) * 1000,
                "max_ms": max(s) * 1000,
                "per_walk_ms": statistics.median(s) * 1000 / b,
                "per_walk_vs_batch_1": statistics.median(s) / b / one,
                "repeats": len(s),
            }
            for b, s in seconds.items()
        },
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench engine-batch", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a model folder or known name")
    ap.add_argument("--prompt-tokens", type=int, default=500, help="tokens of cache each row continues from")
    ap.add_argument("--batches", default="1,2,4,8", help="batch sizes, comma-separated, the first the reference")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, as the chat server)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        batches = [int(b) for b in a.batches.split(",")]
    except ValueError:
        raise SystemExit(f"Error: --batches must be comma-separated integers, got {a.batches!r}") from None
    if not batches or min(batches) < 1 or a.repeats < 1 or a.prompt_tokens < 1:
        raise SystemExit("Error: --batches, --repeats and --prompt-tokens must be 1 or more")
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} on {os.cpu_count()} cores", flush=True)
    result = measure(a.model, a.prompt_tokens, batches, a.repeats, a.threads, a.seed)
    result.update(load_before=load_before, load_after=os.getloadavg(), cores=os.cpu_count())
    print(f"{'batch':>5}  {'ms per forward':>14}  {'ms per walk':>11}  {'per walk vs batch ' + str(batches[0]):>20}")
    for b, r in result["batches"].items():
        print(f"{b:>5}  {r['median_ms']:>14.1f}  {r['per_walk_ms']:>11.1f}  {r['per_walk_vs_batch_1']:>19.2f}×")
    print(f"load average after: {result['load_after'][0]:.2f}")
    print(f"results in {save('engine-batch', result, argv)}")


if __name__ == "__main__":
    main()
