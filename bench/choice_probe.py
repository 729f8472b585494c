"""Can the start model learn which offered choice is right, by plain supervision on the states an online run saw?

    .venv/bin/python -m bench choice-probe --workdir WORKDIR
    .venv/bin/python -m bench choice-probe --workdir WORKDIR --lora-r 64 --lora-alpha 64 --lr 2e-3
    .venv/bin/python -m bench choice-probe --workdir WORKDIR --full --lr 1e-3
    .venv/bin/python -m bench choice-probe --workdir WORKDIR --loss choice

WORKDIR is a ``python -m bench online ... --group-by state --cover-choices`` workdir: its lake's ``state_groups``
hold every choice each visited page offered, scored from the restored state, and ``WORKDIR/tiny`` is the start
model the loop began from. The probe takes the states with a right choice (a group whose scores differ; right =
the group's top score), one row per distinct prompt, and splits them by task seed: ``--held-out-fraction`` of the
seeds are only evaluated on. It then fine-tunes the start model (a fresh LoRA adapter, or ``--full``) with
cross-entropy on a right choice of ``--batch-size`` states drawn at random from the training states, and every
``--eval-every`` steps prints the held-out arg-max accuracy (the choice with the highest log pi(choice + EOS |
prompt) is a right one) and the mean probability of the right choices among the offered ones.

``--loss sequence`` (the default) is cross-entropy on the right choice's whole sequence, over the vocabulary: what
GRPO's sequence loss pushes. ``--loss choice`` is cross-entropy over the state's offered choices only (-log of the
right choices' share of them): what ``--choice-softmax`` pushes. ``--loss both`` is their sum. Comparing them on
the same states says whether training the share alone learns a match that carries over to unseen pages as well as
training the raw sequence does.

What it separates: an online loop that stays at chance on which choice is right either cannot deliver the signal
(too few distinct states per update, too few steps) or the model cannot learn the match at all. This trains on the
same states with every right answer given and batches drawn from all of them; if it learns and the loop does not,
the loop's data flow is what to change (docs/notes/online-grpo-runs-2.md, "What click-button's plateau is").

The figures are printed and written to bench/results/choice-probe/<time>.json. It is a measurement, never a timed
test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import random
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

# One row per scored candidate of a state whose candidates did not all score the same, with the task seed of its
# episode (the split key).
STATES_SQL = """
SELECT s.group_key, s.prompt, s.prompt_hash, s.completion, s.score, s.group_size,
       max(s.score) OVER (PARTITION BY s.group_key) AS group_max, e.task_seed
FROM state_groups AS s
JOIN episodes AS e USING (episode_id)
WHERE NOT s.zero_std
ORDER BY s.group_key, s.candidate_idx
"""


def load_states(lake: str) -> list[dict]:
    """Each distinct page with a right choice: prompt, its offered choices, which are right, its task seed."""
    from halo_data.lake import Lake

    rows = Lake.open(lake).query_arrow(STATES_SQL).to_pylist()
    states: dict[str, dict] = {}
    seen_prompts: set[str] = set()
    for r in rows:
        state = states.get(r["group_key"])
        if state is None:
            if r["prompt_hash"] in seen_prompts:  # the same page sampled again by a later version
                continue
            seen_prompts.add(r["prompt_hash"])
            state = states[r["group_key"]] = {"prompt": r["prompt"], "seed": r["task_seed"], "choices": [], "right": []}
        if r["completion"] in state["choices"]:
            continue
        if r["score"] >= r["group_max"] - 1e-9:
            state["right"].append(len(state["choices"]))
        state["choices"].append(r["completion"])
    return [s for s in states.values() if s["right"] and len(s["choices"]) > 1]


def held_out(seed: int, fraction: float) -> bool:
    """A fixed split of task seeds (not of states: one seed's pages stay on one side)."""
    return int(hashlib.sha256(str(seed).encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < fraction


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench choice-probe", description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", required=True, help="A `bench online --group-by state --cover-choices` workdir.")
    ap.add_argument("--held-out-fraction", type=float, default=0.2, help="Task seeds only evaluated on.")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=32, help="States per optimizer step.")
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-alpha", type=int, default=32)
    ap.add_argument("--full", action="store_true", help="Fine-tune every weight instead of a LoRA adapter.")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--max-held-out", type=int, default=200, help="Held-out states evaluated (the first N).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--loss", choices=("sequence", "choice", "both"), default="sequence",
                    help="sequence: cross-entropy on the right choice's tokens; choice: on its share of the offered "
                         "choices; both: their sum.")
    a = ap.parse_args(argv)

    work = Path(a.workdir)
    model_dir, lake = work / "tiny", work / "lake"
    if not (model_dir / "config.json").exists() or not lake.is_dir():
        raise SystemExit(f"error: {work} is not a `python -m bench online` workdir (no tiny/ model and lake/ there)")
    states = load_states(str(lake))
    train = [s for s in states if not held_out(s["seed"], a.held_out_fraction)]
    held = [s for s in states if held_out(s["seed"], a.held_out_fraction)][: a.max_held_out]
    if len(train) < a.batch_size or not held:
        raise SystemExit(f"error: {len(states)} states with a right choice in {lake}: too few to probe "
                         "(run `bench online --group-by state --cover-choices` for more iterations)")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_train.grpo import pad_members, tokenize_member
    from halo_train.trainer_utils import quiet_hub

    quiet_hub()
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if not a.full:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=a.lora_r, lora_alpha=a.lora_alpha, lora_dropout=0.05, task_type="CAUSAL_LM",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    for s in train + held:
        s["enc"] = [tokenize_member(tokenizer, s["prompt"], c, 256) for c in s["choices"]]

    def logprob_sums(members: list[dict]):
        batch = pad_members(members, tokenizer.pad_token_id)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
        logps = torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
        return (logps * batch["completion_mask"][:, 1:]).sum(-1)

    @torch.no_grad()
    def evaluate(rows: list[dict]) -> tuple[float, float]:
        model.eval()
        right = prob = 0.0
        for s in rows:
            lp = logprob_sums(s["enc"])
            right += int(int(lp.argmax()) in s["right"])
            prob += float(torch.softmax(lp, 0)[s["right"]].sum())
        model.train()
        return right / len(rows), prob / len(rows)

    chance = sum(len(s["right"]) / len(s["choices"]) for s in held) / len(held)
    print(f"{len(train)} training states, {len(held)} held-out states (chance {chance:.2f}); "
          f"{'full fine-tune' if a.full else f'LoRA r {a.lora_r} alpha {a.lora_alpha}'}, lr {a.lr}, batches of {a.batch_size}, "
          f"{a.loss} loss", flush=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr, weight_decay=0.0)
    t0 = time.perf_counter()
    curve = [{"step": 0, "heldout_accuracy": (first := evaluate(held))[0], "heldout_p_right": first[1], "seconds": 0.0}]
    print(f"{'step':>6} {'held-out accuracy':>18} {'P(right)':>9} {'seconds':>8}\n{0:>6} {first[0]:>18.2f} {first[1]:>9.2f} {0:>8.0f}", flush=True)
    for step in range(1, a.steps + 1):
        batch = rng.sample(train, a.batch_size)
        picks = [rng.choice(s["right"]) for s in batch] if a.loss != "choice" else []
        if a.loss == "sequence":
            loss = -logprob_sums([s["enc"][i] for s, i in zip(batch, picks)]).mean()
        else:  # -log of the right choices' share of the page's offered choices, averaged over states
            lps = logprob_sums([m for s in batch for m in s["enc"]]).split([len(s["enc"]) for s in batch])
            loss = -torch.stack([torch.logsumexp(lp[s["right"]], 0) - torch.logsumexp(lp, 0) for lp, s in zip(lps, batch)]).mean()
            if a.loss == "both":
                loss = loss - torch.stack([lp[i] for lp, i in zip(lps, picks)]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % a.eval_every == 0 or step == a.steps:
            acc, p = evaluate(held)
            curve.append({"step": step, "heldout_accuracy": acc, "heldout_p_right": p, "seconds": time.perf_counter() - t0})
            print(f"{step:>6} {acc:>18.2f} {p:>9.2f} {curve[-1]['seconds']:>8.0f}", flush=True)
    (RESULTS / "choice-probe").mkdir(parents=True, exist_ok=True)
    out = RESULTS / "choice-probe" / f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps({"workdir": str(work), "options": vars(a), "train_states": len(train), "heldout_states": len(held),
                               "chance": chance, "curve": curve}, indent=2))
    print(f"results in {out}")


if __name__ == "__main__":
    main()
