"""halo-train's option checks and one-line errors (no training: each fails before a model loads)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from halo_data.lake import Lake
from halo_train.cli import main
from halo_train.config import BCConfig, DPOConfig, GRPOConfig, TrainConfigError, load_config
from halo_train.testing import write_fixture_episodes


@pytest.fixture(scope="module")
def lakes(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    single = Lake.init(root / "single")
    write_fixture_episodes(single, attempts=1)  # one attempt per task: no pairs, no groups with spread
    full = Lake.init(root / "full")
    write_fixture_episodes(full)
    model = root / "model"
    model.mkdir()  # exists: the checks that need a model's files come after the ones tested here
    return {"single": str(root / "single"), "full": str(root / "full"), "model": str(model), "root": root}


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def error_line(result) -> str:
    """The one ``Error:`` line, last in the output (progress logs may come before it), and no traceback."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in result.output, result.output
    return errors[0]


def test_empty_dpo_view_says_what_to_collect(lakes):
    result = invoke("dpo", "--lake", lakes["single"], "--base-model", lakes["model"])
    assert error_line(result) == (
        "Error: no DPO pairs: collect at least two attempts per task (halo-agent rollout --rollouts-per-task 2 or more), "
        f"or search trees (halo-agent search); lake: {lakes['single']}"
    )


def test_empty_filter_names_the_filter(lakes):
    result = invoke("bc", "--lake", lakes["full"], "--base-model", lakes["model"], "--where", "task_id = 'nope'")
    assert error_line(result).startswith("Error: no BC rows: collect episodes with valid actions first")
    assert "(with --where \"task_id = 'nope'\")" in result.output


def test_grpo_with_only_zero_std_groups(lakes, tmp_path):
    from halo_train.tiny_model import build_tokenizer, build_model

    tokenizer = build_tokenizer()
    build_model(tokenizer).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    result = invoke("grpo", "--lake", lakes["single"], "--base-model", str(tmp_path / "m"), "--output-dir", str(tmp_path / "o"))
    assert error_line(result).startswith("Error: no GRPO rows with a reward signal: all 3 group(s) have zero reward std")


def test_missing_base_model_path(lakes):
    result = invoke("bc", "--lake", lakes["full"], "--base-model", "./models/does-not-exist")
    assert error_line(result) == (
        "Error: base model path ./models/does-not-exist does not exist: build a test model with "
        "`halo-train make-tiny-model ./models/does-not-exist` or pass a hub id"
    )


def test_conflicting_options(lakes):
    result = invoke("dpo", "--lake", lakes["full"], "--base-model", lakes["model"], "--top-percent", "30")
    assert error_line(result) == (
        "Error: --top-percent only changes the views bc_rows, progress_ranking; dpo_pairs does not read it: "
        "drop --top-percent or filter with --where"
    )
    result = invoke("bc", "--lake", lakes["full"], "--base-model", lakes["model"], "--top-percent", "30",
                    "--set", "top_percent=20")
    assert error_line(result) == "Error: top_percent is given both as --top-percent and --set: give it once"
    result = invoke("dpo", "--lake", lakes["full"], "--base-model", lakes["model"], "--loss-type", "sigmoid,ipo", "--loss-weights", "1")
    assert "--loss-weights has 1 value(s) for 2 --loss-type value(s)" in error_line(result)
    result = invoke("grpo", "--lake", lakes["full"], "--base-model", lakes["model"], "--view", "bc_rows")
    assert error_line(result).startswith("Error: grpo reads the grpo_groups view")


def test_view_parameters_are_set_with_set_and_param_is_deprecated(lakes):
    """--set means a view parameter in every HALO CLI (in halo-data query, -p/--param is a SQL parameter)."""
    result = invoke("bc", "--lake", lakes["full"], "--base-model", lakes["model"], "--set", "gamma")
    assert error_line(result) == "Error: bad parameter 'gamma': write NAME=VALUE, e.g. gamma=0.95"
    result = invoke("bc", "--lake", lakes["full"], "--base-model", lakes["model"], "--top-percent", "30",
                    "--param", "top_percent=20")
    assert result.output.splitlines()[0] == "--param is deprecated: write --set top_percent=20"
    assert error_line(result) == "Error: top_percent is given both as --top-percent and --set: give it once"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from halo_train.tiny_model import build_model, build_tokenizer

    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tokenizer()
    build_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_a_job_shows_a_progress_bar_not_the_trainer_log_dicts(lakes, tiny_model, tmp_path):
    """The bar and the result lines; each trainer log dict only with -v (all of them are in train_metrics)."""
    args = ["bc", "--lake", lakes["full"], "--base-model", tiny_model, "--max-steps", "2", "--batch-size", "2",
            "--lora-r", "2", "--output-dir"]
    quiet = invoke(*args, str(tmp_path / "quiet"))
    assert quiet.exit_code == 0, quiet.output
    assert "'loss'" not in quiet.output and not any(line.startswith('{') for line in quiet.output.splitlines())
    assert "bc: 100%" in quiet.stderr and "2/2" in quiet.stderr
    assert quiet.stdout.splitlines()[0].startswith("run train-bc-") and "2 steps on" in quiet.stdout
    loud = invoke("-v", *args, str(tmp_path / "loud"))
    assert loud.exit_code == 0, loud.output
    logged = [line for line in loud.stderr.splitlines() if line.startswith("bc step ")]
    assert [line.split(":")[0] for line in logged[:2]] == ["bc step 1", "bc step 2"]
    assert '"loss": ' in logged[0]


def test_where_must_be_read_only(lakes):
    result = invoke("bc", "--lake", lakes["full"], "--base-model", lakes["model"], "--where", "true; DROP VIEW steps")
    assert error_line(result).startswith("Error: ")
    assert "not allowed" in result.output or "several statements" in result.output


def test_unsloth_without_a_gpu(lakes, monkeypatch):
    from halo_train import backends

    monkeypatch.setattr(backends, "cuda_available", lambda: False)
    with pytest.raises(TrainConfigError, match="--backend unsloth needs a CUDA GPU"):
        backends.resolve_backend("unsloth")
    assert backends.resolve_backend("auto") == "peft"


def test_resume_from_must_be_a_checkpoint(lakes):
    result = invoke("bc", "--lake", lakes["full"], "--base-model", lakes["model"], "--resume-from", lakes["model"])
    assert "is not a checkpoint (no trainer_state.json)" in error_line(result)


def test_yaml_config_and_overrides(tmp_path, lakes):
    path = tmp_path / "grpo.yaml"
    path.write_text(f"base-model: {lakes['model']}\nloss_type: grpo\nscale_rewards: group\nparams:\n  omega: 0.5\n")
    cfg = load_config(GRPOConfig, path, overrides={"scale_rewards": "none", "lr": None})
    assert (cfg.loss_type, cfg.scale_rewards, cfg.omega, cfg.lr) == ("grpo", "none", 0.5, 1e-5)
    path.write_text(f"base_model: {lakes['model']}\nlearning_rate: 0.1\n")
    with pytest.raises(TrainConfigError, match="unknown option\\(s\\) for grpo: learning_rate"):
        load_config(GRPOConfig, path)


def test_config_defaults_and_checks(lakes, monkeypatch):
    monkeypatch.setenv("HALO_LAKE", lakes["full"])
    cfg = DPOConfig(base_model=lakes["model"])
    assert (cfg.lake, cfg.view, cfg.beta, cfg.loss_type, cfg.lora_r, cfg.lora_alpha) == (lakes["full"], "dpo_pairs", 0.1, ["sigmoid"], 16, 32)
    assert BCConfig(base_model=lakes["model"], target_modules="q_proj, v_proj").target_modules == ["q_proj", "v_proj"]
    with pytest.raises(TrainConfigError, match="--lora-r must be at least 1"):
        BCConfig(base_model=lakes["model"], lora_r=0)
    with pytest.raises(TrainConfigError, match="give --base-model"):
        BCConfig()


def test_every_command_is_documented():
    result = invoke("--help")
    for command in ("bc", "dpo", "grpo", "merge", "make-tiny-model", "quickstart"):
        assert command in result.output
        sub = invoke(command, "--help")
        assert sub.exit_code == 0 and len(sub.output) > 200
