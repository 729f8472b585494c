"""What a batched choice-walk step costs: the chat server's decode forward of the served model at batch 1, 2, 4, ...

    .venv/bin/python -m bench engine-batch                       # smollm2-135m-instruct, a 500-token prompt
    .venv/bin/python -m bench engine-batch --prompt-tokens 300 --batches 1,2,4,8 --kernels onednn

HALO's chat server walks a guided choice token by token (``ChoiceWalk``): wherever the mask allows more than one
token it runs one forward of the tokens since the last place computed, continuing from the prompt's KV cache, and
the engine advances every walk in progress in one padded forward (``advance_walks``). On a CPU a small model's
decode forward is bound by reading its weights, so a forward of B walks' tokens may cost far less than B forwards
of one; how much less depends on the linear layers' kernel (``--linear-kernel``: torch's MKL sgemm reads the
weights once a row below 4 rows, oneDNN's once a forward). This measures the engine's own step
(``forward_padded``, each row continuing from its own cache of about ``--prompt-tokens`` tokens, lengths apart by
7, with ``--fed`` new tokens a row: 1 a decode, more a drafted walk) at every batch size in ``--batches``, under
each kernel in ``--kernels``, ``--repeats`` times each, interleaved round by round so every arm meets the same
machine, with the engine's thread count. Also a prefill of ``--prompt-tokens`` tokens under each kernel.

Printed and written to bench/results/engine-batch/<time>.json: the median milliseconds per forward at each batch
size, and its cost per walk relative to one walk alone under the same kernel (below 1: batching pays).
A measurement, never a timed test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.reports import save


def measure(model_name: str, prompt_tokens: int, batches: list[int], repeats: int, threads: int | None, seed: int,
            kernels: list[str], fed: int = 1) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from halo_agent.models import resolve_model
    from halo_agent.policies.linear_kernels import use_onednn_linear, use_torch_linear
    from halo_agent.policies.prefix_cache import PromptCache, forward_padded

    if threads:
        torch.set_num_threads(threads)
    path = resolve_model(model_name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    widest = max(batches)

    def use(kernel: str) -> None:
        use_onednn_linear(model) if kernel == "onednn" else use_torch_linear(model)

    with torch.inference_mode():
        cache = PromptCache(widest)
        roots = [cache.prefill(model, torch.randint(0, vocab, (prompt_tokens + 7 * i,), generator=generator).tolist(), None, "cpu")
                 for i in range(widest)]
        prompt = torch.randint(0, vocab, (1, prompt_tokens), generator=generator)

        def forward(batch: int) -> float:
            # each row continues from its own prompt's cache, as each walk does from its own request's prompt
            plans = [(root.ids + tuple(torch.randint(0, vocab, (fed,), generator=generator).tolist()), root, len(root.ids), ())
                     for root in roots[:batch]]
            started = time.perf_counter()
            forward_padded(model, plans, "cpu")
            return time.perf_counter() - started

        def prefill() -> float:
            started = time.perf_counter()
            model(input_ids=prompt, use_cache=True, logits_to_keep=1)
            return time.perf_counter() - started

        for kernel in kernels:  # warm-up: first calls allocate
            use(kernel)
            for batch in batches:
                forward(batch)
        seconds: dict[tuple[str, int], list[float]] = {(k, b): [] for k in kernels for b in batches}
        prefills: dict[str, list[float]] = {k: [] for k in kernels}
        for _ in range(repeats):
            for kernel in kernels:
                use(kernel)
                for batch in batches:
                    seconds[(kernel, batch)].append(forward(batch))
                prefills[kernel].append(prefill())
    out: dict = {"model": model_name, "model_path": path, "torch_threads": torch.get_num_threads(),
                 "prompt_tokens": prompt_tokens, "fed_tokens": fed, "kernels": {}}
    for kernel in kernels:
        one = statistics.median(seconds[(kernel, batches[0])]) / batches[0]
        out["kernels"][kernel] = {
            "prefill_ms": statistics.median(prefills[kernel]) * 1000,
            "batches": {
                str(b): {
                    "median_ms": statistics.median(s) * 1000,
                    "min_ms": min(s) * 1000,
                    "max_ms": max(s) * 1000,
                    "per_walk_ms": statistics.median(s) * 1000 / b,
                    "per_walk_vs_batch_1": statistics.median(s) / b / one,
                    "repeats": len(s),
                }
                for (k, b), s in seconds.items() if k == kernel
            },
        }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench engine-batch", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a model folder or known name")
    ap.add_argument("--prompt-tokens", type=int, default=500, help="tokens of cache each row continues from")
    ap.add_argument("--batches", default="1,2,4,8", help="batch sizes, comma-separated, the first the reference")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, as the chat server)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", default="torch,onednn", help="the linear kernels to compare, comma-separated")
    ap.add_argument("--fed", type=int, default=1, help="new tokens a row feeds (1: a decode step; more: a drafted walk)")
    a = ap.parse_args(argv)
    kernels = a.kernels.split(",")
    if not set(kernels) <= {"torch", "onednn"} or a.fed < 1:
        raise SystemExit("Error: --kernels takes torch and/or onednn, --fed 1 or more")
    try:
        batches = [int(b) for b in a.batches.split(",")]
    except ValueError:
        raise SystemExit(f"Error: --batches must be comma-separated integers, got {a.batches!r}") from None
    if not batches or min(batches) < 1 or a.repeats < 1 or a.prompt_tokens < 1:
        raise SystemExit("Error: --batches, --repeats and --prompt-tokens must be 1 or more")
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} on {os.cpu_count()} cores", flush=True)
    result = measure(a.model, a.prompt_tokens, batches, a.repeats, a.threads, a.seed, kernels, a.fed)
    result.update(load_before=load_before, load_after=os.getloadavg(), cores=os.cpu_count())
    print(f"{'kernel':>7}  {'batch':>5}  {'ms per forward':>14}  {'ms per walk':>11}  {'per walk vs batch ' + str(batches[0]):>20}")
    for kernel, k in result["kernels"].items():
        for b, r in k["batches"].items():
            print(f"{kernel:>7}  {b:>5}  {r['median_ms']:>14.1f}  {r['per_walk_ms']:>11.1f}  {r['per_walk_vs_batch_1']:>19.2f}×")
        print(f"{kernel:>7}  prefill of {a.prompt_tokens} tokens: {k['prefill_ms']:.0f} ms")
    print(f"load average after: {result['load_after'][0]:.2f}")
    print(f"results in {save('engine-batch', result, argv)}")


if __name__ == "__main__":
    main()
