"""BC, DPO and GRPO jobs train a real tiny model for a few steps on a real lake under tmp_path."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from halo_data.lake import Lake
from halo_train import BCConfig, DPOConfig, GRPOConfig, train_bc, train_dpo, train_grpo
from halo_train.cli import main
from halo_train.config import TrainConfigError
from halo_train.testing import write_fixture_episodes
from halo_train.tiny_model import build_tiny_model

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

FAST = dict(batch_size=4, lora_r=4, lora_alpha=8, logging_steps=1)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    lake = Lake.init(root / "lake")
    write_fixture_episodes(lake)
    model = build_tiny_model(root / "tiny")
    return {"root": root, "lake": str(root / "lake"), "model": str(model)}


def lora_b_norms(adapter_dir: Path) -> dict[str, float]:
    from safetensors.torch import load_file

    weights = load_file(str(adapter_dir / "adapter_model.safetensors"))
    return {k: float(v.norm()) for k, v in weights.items() if "lora_B" in k}


def check_adapter(adapter_dir: Path, base_model: str) -> None:
    """LoRA B starts at zero (peft's init), so a trained adapter has non-zero B; it loads back with peft."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert (adapter_dir / "adapter_config.json").exists()
    assert (adapter_dir / "training_stats.json").exists()
    norms = lora_b_norms(adapter_dir)
    assert norms and all(n > 0 for n in norms.values())
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_model), str(adapter_dir))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        tuned = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
    assert not torch.allclose(tuned, base)


def metrics_of(lake_root: str, run_id: str) -> list[dict]:
    lake = Lake.open(lake_root)
    return lake.query_arrow(
        "select step, metric, value from train_metrics where run_id = $r order by step, metric", {"r": run_id}
    ).to_pylist()


def run_row(lake_root: str, run_id: str) -> dict:
    rows = Lake.open(lake_root).query_arrow("select * from runs where run_id = $r", {"r": run_id}).to_pylist()
    assert len(rows) == 1
    return rows[0]


def test_bc_trains_saves_logs_and_resumes(workspace):
    out = workspace["root"] / "bc"
    cfg = BCConfig(lake=workspace["lake"], base_model=workspace["model"], output_dir=str(out), max_steps=2, save_steps=1, **FAST)
    result = train_bc(cfg)
    assert result.global_step == 2 and result.rows == 16
    check_adapter(result.final_adapter, workspace["model"])
    assert [p.name for p in result.checkpoints] == ["checkpoint-1", "checkpoint-2"]
    assert lora_b_norms(out / "checkpoint-1") != lora_b_norms(result.final_adapter)
    stats = json.loads((out / "checkpoint-1" / "training_stats.json").read_text())
    assert stats["global_step"] == 1 and stats["run_id"] == result.run_id and stats["job_type"] == "bc"

    metrics = metrics_of(workspace["lake"], result.run_id)
    names = {m["metric"] for m in metrics}
    assert {"loss", "learning_rate", "grad_norm", "tokens_per_second"} <= names
    assert [m["step"] for m in metrics if m["metric"] == "loss"] == [1, 2]

    run = run_row(workspace["lake"], result.run_id)
    assert (run["kind"], run["job_type"], run["status"], run["source_view"]) == ("train", "bc", "finished", "bc_rows")
    assert json.loads(run["lineage"]) == result.lineage and result.lineage["steps"] >= 1
    assert json.loads(run["config"])["max_steps"] == 2 and run["base_model"] == str(Path(workspace["model"]).resolve())
    git_sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert json.loads(run["provenance"])["git_sha"] == git_sha  # the same provenance as a rollout's run
    assert "--lora-modules qwen_worker_bc=" in result.serve_command
    assert result.eval_command.endswith("halo-agent eval --modes qwen_worker_bc")

    # Resume from step 1 with a longer budget: steps 2 and 3 run again under the same run id, same snapshot.
    resumed = train_bc(BCConfig(**{**cfg.to_dict(), "max_steps": 3, "resume_from": str(out / "checkpoint-1"), "save_steps": None}))
    assert resumed.run_id == result.run_id and resumed.global_step == 3 and resumed.lineage == result.lineage
    assert [m["step"] for m in metrics_of(workspace["lake"], result.run_id) if m["metric"] == "loss"] == [1, 2, 2, 3]
    assert json.loads((resumed.final_adapter / "training_stats.json").read_text())["policy_version"] == "3"


def test_one_seed_one_adapter(workspace):
    """The same rows (in one order) and one seed give the same adapter, LoRA's random A included; another seed
    another: a training seed of an experiment is a run that repeats."""
    from safetensors.torch import load_file

    def trained(seed: int, name: str) -> dict:
        cfg = BCConfig(lake=workspace["lake"], base_model=workspace["model"], output_dir=str(workspace["root"] / name),
                       max_steps=2, seed=seed, **FAST)
        return load_file(str(train_bc(cfg).final_adapter / "adapter_model.safetensors"))

    first, again, other = trained(0, "seed-0"), trained(0, "seed-0-again"), trained(1, "seed-1")
    assert first.keys() == again.keys() and all(first[k].equal(again[k]) for k in first)
    assert all(not first[k].equal(other[k]) for k in first if "lora_A" in k)


def test_a_new_adapter_draws_from_its_seed_and_leaves_the_callers_rng_as_it_was(workspace):
    import torch
    from transformers import AutoModelForCausalLM

    from halo_train.backends import lora_config
    from halo_train.lora import new_adapter

    cfg = BCConfig(lake=workspace["lake"], base_model=workspace["model"], **FAST)
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    adapters = [new_adapter(AutoModelForCausalLM.from_pretrained(workspace["model"]), lora_config(cfg), 7) for _ in range(2)]
    assert torch.rand(4).equal(expected)  # no draw of the caller's was used or reseeded
    a, b = ({n: p for n, p in m.named_parameters() if "lora_A" in n} for m in adapters)
    assert a.keys() == b.keys() and a and all(a[n].equal(b[n]) for n in a)


def test_a_job_resumed_from_a_checkpoint_ends_where_the_uninterrupted_job_ends(workspace):
    """Killed after its first checkpoint and resumed (the checkpoint alone carried over), a job trains the batches an
    uninterrupted one trains, in its order, and writes the same adapter."""
    import shutil

    from safetensors.torch import load_file

    root = workspace["root"]
    common = dict(lake=workspace["lake"], base_model=workspace["model"], max_steps=3, save_steps=1, **FAST)
    whole = train_bc(BCConfig(output_dir=str(root / "whole"), **common))
    shutil.copytree(root / "whole" / "checkpoint-1", root / "resumed" / "checkpoint-1")
    resumed = train_bc(BCConfig(output_dir=str(root / "resumed"), resume_from=str(root / "resumed" / "checkpoint-1"), **common))
    a, b = (load_file(str(r.final_adapter / "adapter_model.safetensors")) for r in (whole, resumed))
    assert resumed.global_step == 3 and a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_dpo_trains_with_trl_metrics(workspace):
    out = workspace["root"] / "dpo"
    result = train_dpo(DPOConfig(lake=workspace["lake"], base_model=workspace["model"], output_dir=str(out), max_steps=2, lr=1e-3, **FAST))
    assert result.global_step == 2 and result.rows == 4
    check_adapter(result.final_adapter, workspace["model"])
    assert not (result.final_adapter / "ref").exists()  # TRL's copy of the starting adapter stays out of the final one
    names = {m["metric"] for m in metrics_of(workspace["lake"], result.run_id)}
    assert {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "tokens_per_second"} <= names
    assert run_row(workspace["lake"], result.run_id)["source_view"] == "dpo_pairs"
    # Epoch checkpoints: 4 pairs / batch 4 = one step per epoch, so the stop at step 2 is epoch 2's checkpoint.
    assert (out / "checkpoint-2" / "adapter_model.safetensors").exists()


def test_grpo_reinforce_from_stored_groups(workspace):
    out = workspace["root"] / "grpo"
    result = train_grpo(
        GRPOConfig(lake=workspace["lake"], base_model=workspace["model"], output_dir=str(out), max_steps=2, lr=1e-3, save_steps=1, **FAST)
    )
    assert result.rows == 16 and result.extra["zero_std_groups"] == 1 and result.extra["skipped_rows"] == 8
    check_adapter(result.final_adapter, workspace["model"])
    metrics = metrics_of(workspace["lake"], result.run_id)
    zero = [m["value"] for m in metrics if m["metric"] == "frac_reward_zero_std"]
    assert zero and all(v == pytest.approx(1 / 3) for v in zero)
    assert all(m["value"] == 0 for m in metrics if m["metric"] == "frac_rows_off_policy")
    assert {"reward", "reward_std", "loss", "advantage_abs_mean"} <= {m["metric"] for m in metrics}

    resumed = train_grpo(GRPOConfig(lake=workspace["lake"], base_model=workspace["model"], output_dir=str(out), max_steps=3,
                                    lr=1e-3, resume_from=str(out / "checkpoint-2"), **FAST))
    assert resumed.run_id == result.run_id and resumed.global_step == 3
    assert [m["step"] for m in metrics_of(workspace["lake"], result.run_id) if m["metric"] == "loss"] == [1, 2, 3]


def test_grpo_beta_adds_a_kl_to_the_base_model(workspace):
    out = workspace["root"] / "grpo-kl"
    result = train_grpo(GRPOConfig(lake=workspace["lake"], base_model=workspace["model"], output_dir=str(out), max_steps=3,
                                   lr=2e-2, beta=0.5, **FAST))
    kl = [m["value"] for m in sorted(metrics_of(workspace["lake"], result.run_id), key=lambda m: m["step"]) if m["metric"] == "kl"]
    # A fresh LoRA starts as the base model (KL 0); the updates move it away.
    assert len(kl) == 3 and kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 1e-6
    with pytest.raises(TrainConfigError, match="--beta must be 0"):
        GRPOConfig(lake=workspace["lake"], base_model=workspace["model"], beta=-1)


def test_grpo_with_behaviour_logprobs_uses_importance_ratios(workspace, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_train.grpo import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(workspace["model"])
    tokenizer = AutoTokenizer.from_pretrained(workspace["model"])
    lake = Lake.init(tmp_path / "lake")
    # The behaviour policy is the base model itself, slightly off: ratios near 1, some clipped.
    write_fixture_episodes(lake, n_tasks=2, attempts=2, logprob_fn=lambda p, c: completion_logprobs(model, tokenizer, p, c) - 0.1)
    result = train_grpo(GRPOConfig(lake=str(tmp_path / "lake"), base_model=workspace["model"], output_dir=str(tmp_path / "out"),
                                   max_steps=1, lr=1e-3, **FAST))
    assert result.extra["rows_with_behaviour_logprobs"] == result.rows == 4
    check_adapter(result.final_adapter, workspace["model"])
    metrics = {m["metric"]: m["value"] for m in metrics_of(str(tmp_path / "lake"), result.run_id)}
    assert metrics["frac_rows_off_policy"] == 1.0
    assert metrics["importance_ratio_mean"] == pytest.approx(1.0, abs=0.1)


def test_cli_trains_from_a_yaml_config_with_tensorboard_and_merges(workspace, tmp_path):
    config = tmp_path / "bc.yaml"
    config.write_text(
        f"lake: {workspace['lake']}\nbase-model: {workspace['model']}\nmax_steps: 1\nbatch_size: 4\nlora_r: 4\n"
        f"lora_alpha: 8\nreport_to: tensorboard\nwhere: \"task_id <> 'miniwob.fixture-task-0'\"\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["bc", "--config", str(config), "--output-dir", str(out), "--adapter-name", "web-bc"])
    assert result.exit_code == 0, result.output
    assert f"vllm serve {Path(workspace['model']).resolve()} --enable-lora --lora-modules web-bc={(out / 'final').resolve()}" in result.output
    assert "halo-agent" in result.output
    assert list(out.glob("runs/**/events.out.tfevents.*"))
    stats = json.loads((out / "final" / "training_stats.json").read_text())
    expected = Lake.open(workspace["lake"]).query_arrow(
        "select count(*) as n from bc_rows where task_id <> 'miniwob.fixture-task-0'").to_pylist()[0]["n"]
    assert stats["where"] == "task_id <> 'miniwob.fixture-task-0'" and stats["rows"] == expected < 16

    merged = tmp_path / "merged"
    result = CliRunner().invoke(main, ["merge", "--adapter", str(out / "final"), "--output", str(merged)])
    assert result.exit_code == 0, result.output
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        plain = AutoModelForCausalLM.from_pretrained(merged)(input_ids=ids).logits
        adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(workspace["model"]), str(out / "final"))(input_ids=ids).logits
    assert torch.allclose(plain, adapted, atol=1e-5)
