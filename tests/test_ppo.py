"""halo-train ppo: clipped PPO with a value head and GAE on a tiny model; offline on lake steps, online through the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from halo_agent.envs.os_env import OS_PROMPT_VERSION, SYSTEM_PROMPT, agent_turn  # noqa: E402
from halo_data import prompts  # noqa: E402
from halo_data.lake import Lake  # noqa: E402
from halo_data.records import EpisodeRecord, StepRecord  # noqa: E402
from halo_data.writer import EpisodeWriter  # noqa: E402
from halo_train.ppo import PPOConfig, PPOError, Turn, gae, train_ppo  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    from halo_train.tiny_model import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("ppo") / "tiny"))


def write_os_episodes(lake: Lake, n: int = 6) -> None:
    """Two-turn os episodes as the environment writes them: half solved (+1), half not (-0.5)."""
    writer = EpisodeWriter(lake)
    for i in range(n):
        correct = i % 2 == 0
        command = "useradd alice" if correct else "ls"
        history = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Create a user account named alice."}]
        steps = []
        for step_idx, action in enumerate([command, "finish"]):
            reward = (1.0 if correct else -0.5) if step_idx == 1 else 0.0
            steps.append(StepRecord(step_idx=step_idx, prompt=prompts.dumps(history), prompt_version=OS_PROMPT_VERSION,
                                    model_output=agent_turn(action), action=action, action_valid=True, rewards={"success": reward},
                                    weights={"success": 1.0}, logprobs=[-1.0] * 3))
            history = history + [{"role": "assistant", "content": agent_turn(action)}, {"role": "user", "content": "The output of the OS is empty."}]
        writer.write_episode(EpisodeRecord(run_id="os-rollout", env="os", task_id="os.users-add", site="users", attempt_idx=i,
                                           success=correct, task_reward=1.0 if correct else -0.5, terminated=True), steps)
    writer.close()


def lora_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def test_gae_over_the_turns_of_each_episode():
    turns = [Turn("a", [], [], [], reward=0.0, last=False, correct=False, old_value=0.5),
             Turn("a", [], [], [], reward=1.0, last=True, correct=True, old_value=0.25),
             Turn("b", [], [], [], reward=-0.5, last=True, correct=False, old_value=0.0)]
    gae(turns, gamma=1.0, lam=0.5)
    # a: delta_1 = 1 - 0.25 = 0.75; delta_0 = 0 + 0.25 - 0.5 = -0.25, A_0 = -0.25 + 0.5 * 0.75
    assert [round(t.advantage, 6) for t in turns] == [0.125, 0.75, -0.5]
    assert [round(t.ret, 6) for t in turns] == [0.625, 1.0, -0.5]


def test_an_update_on_a_fixed_batch_raises_positive_advantage_answers_and_lowers_negative_ones(tiny):
    from halo_train import backends
    from halo_train.data import chat_text
    from halo_train.ppo import ValueHead, fill_old, forward, make_optimizer, update

    cfg = PPOConfig(base_model=tiny, from_lake=True, ppo_epochs=4, batch_size=4, lr=2e-3, entropy_coef=0.0)
    loaded = backends.load_for_training(cfg)
    model, tokenizer = loaded.model, loaded.tokenizer
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Create a user account named alice."}]
    prompt = tokenizer(chat_text(tokenizer, messages, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    answers = {True: agent_turn("useradd alice"), False: agent_turn("ls -la")}
    turns = []
    for i in range(8):
        right = i % 2 == 0
        completion = tokenizer(answers[right], add_special_tokens=False)["input_ids"] + [eos]
        turns.append(Turn(f"e{i}", prompt, completion, [None] * len(completion), reward=1.0 if right else -0.5, last=True, correct=right))
    value_head = ValueHead(model.config.hidden_size, "cpu")
    optimizer = make_optimizer(cfg, model, value_head)
    pad = tokenizer.pad_token_id
    model.eval()
    fill_old(model, value_head, turns, pad, cfg.batch_size, kl=False)
    gae(turns, cfg.gamma, cfg.gae_lambda)
    assert [t.advantage for t in turns[:2]] == [1.0, -0.5]  # a zero value head: A = r on a one-turn episode

    command_start = len(tokenizer(agent_turn("x").split("x")[0], add_special_tokens=False)["input_ids"])

    def command_logprobs() -> tuple[float, float]:
        """Mean logprob of each answer's command tokens (where the right and the wrong answer differ)."""
        with torch.no_grad():
            logprobs, _, _ = forward(model, value_head, turns[:2], pad, with_values=False)
        return tuple(float(lp[command_start:-5].mean()) for lp in logprobs)

    right_before, wrong_before = command_logprobs()
    stats = update(cfg, model, value_head, optimizer, turns, pad, seed=0)
    right_after, wrong_after = command_logprobs()
    assert right_after > right_before + 0.05, (right_before, right_after)
    assert wrong_after < wrong_before - 0.05, (wrong_before, wrong_after)
    assert stats["approx_kl"] >= 0 and stats["value_loss"] > 0


def test_offline_epochs_on_lake_steps_change_the_adapter_and_record_everything(tiny, tmp_path):
    lake = Lake.init(tmp_path / "lake")
    write_os_episodes(lake)
    out = tmp_path / "out"
    cfg = PPOConfig(base_model=tiny, from_lake=True, where="env = 'os'", epochs=1, ppo_epochs=2, batch_size=4, lr=0.01,
                    kl_coef=0.05, lake=str(lake.root), output_dir=str(out), run_id="ppo-offline")
    result = train_ppo(cfg)
    epoch_1 = out / "epoch_1"
    assert result.final_adapter == epoch_1
    assert {"adapter_config.json", "adapter_model.safetensors", "value_head.pt", "optimizer.pt", "training_stats.json"} <= {
        p.name for p in epoch_1.iterdir()}
    config = json.loads((epoch_1 / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["lora_alpha"] == 32 and config["lora_dropout"] == 0.0
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    stats = json.loads((epoch_1 / "training_stats.json").read_text())
    assert stats["epoch"] == 1 and stats["run_id"] == "ppo-offline" and stats["lineage"]["steps"] >= 0
    metrics = {r["metric"]: r["value"] for r in lake.query_arrow(
        "select metric, value from train_metrics where run_id = 'ppo-offline' and step = 1").to_pylist()}
    for name in ("policy_loss", "value_loss", "entropy", "kl", "clip_fraction", "reward", "accuracy"):
        assert name in metrics, name
    assert metrics["reward"] == pytest.approx(0.25) and metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["kl"] >= 0 and metrics["entropy"] > 0
    run = lake.query_arrow("select job_type, status, policy_version, lineage from runs where run_id = 'ppo-offline'").to_pylist()[0]
    assert run["job_type"] == "ppo" and run["status"] == "finished" and run["policy_version"] == "1"
    assert json.loads(run["lineage"])["steps"] == stats["lineage"]["steps"]
    value_head = torch.load(epoch_1 / "value_head.pt")
    assert float(value_head["weight"].abs().sum()) > 0  # trained from its zero start

    # --resume-from continues the same run at epoch 2, from epoch 1's adapter, value head and optimizer.
    resumed = train_ppo(PPOConfig(base_model=tiny, from_lake=True, where="env = 'os'", epochs=2, ppo_epochs=1, batch_size=4,
                                  lr=0.01, lake=str(lake.root), output_dir=str(out), resume_from=str(epoch_1)))
    assert resumed.run_id == "ppo-offline" and resumed.final_adapter == out / "epoch_2"
    one, two = lora_weights(epoch_1), lora_weights(out / "epoch_2")
    assert any(not torch.equal(one[k], two[k]) for k in one)
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 0.1  # a continuation, not a fresh LoRA
    steps = lake.query_arrow("select distinct step from train_metrics where run_id = 'ppo-offline' order by step").column(0).to_pylist()
    assert steps == [1, 2]


def test_bad_options_are_one_clear_error(tiny, tmp_path):
    with pytest.raises(PPOError, match="exactly one of --engine-url URL or --serve"):
        PPOConfig(base_model=tiny)
    with pytest.raises(PPOError, match="--ppo-epochs must be at least 1"):
        PPOConfig(base_model=tiny, from_lake=True, ppo_epochs=0)
    with pytest.raises(PPOError, match="--value-lr must be positive"):
        PPOConfig(base_model=tiny, from_lake=True, value_lr=0)
    with pytest.raises(PPOError, match="unknown outcome"):
        PPOConfig(base_model=tiny, from_lake=True, reward_map="great=1")
    lake = Lake.init(tmp_path / "empty")
    with pytest.raises(PPOError, match="no steps to train on"):
        train_ppo(PPOConfig(base_model=tiny, from_lake=True, lake=str(lake.root), output_dir=str(tmp_path / "o")))


@pytest.mark.slow
def test_online_epoch_through_the_chat_server_and_eval_with_the_adapter(tiny, tmp_path):
    from halo_agent.envs.os_sandbox import check_host

    try:
        check_host()
    except Exception as e:
        pytest.skip(f"os sandbox unavailable: {e}")
    from click.testing import CliRunner

    from halo_agent.cli import main as agent_main

    lake = str(tmp_path / "lake")
    out = tmp_path / "out"
    cfg = PPOConfig(base_model=tiny, serve=True, tasks=["os.users-add", "os.files-make-dirs"], epochs=2, samples_per_epoch=2,
                    ppo_epochs=1, batch_size=4, max_episode_steps=1, max_tokens=16, lake=lake, output_dir=str(out), run_id="ppo-online")
    result = train_ppo(cfg)
    assert [p.name for p in result.checkpoints] == ["epoch_1", "epoch_2"]
    rows = Lake.open(lake).query_arrow(
        "select run_id, policy_version, count(*) n, bool_and(logprobs is not null) lp from steps group by all order by run_id").to_pylist()
    assert [(r["run_id"], r["policy_version"]) for r in rows] == [("ppo-online-e1", "0"), ("ppo-online-e2", "1")]
    assert all(r["lp"] for r in rows)  # every sampled step stored its tokens' logprobs
    # halo-agent eval --env os with the adapter, unmerged, through the hf policy and a modes file.
    modes = tmp_path / "modes.yaml"
    modes.write_text(f"modes:\n  ppo_local:\n    policy: hf\n    model: {tiny}\n    adapter: {out / 'epoch_2'}\n    policy_options: {{max_new_tokens: 16}}\n")
    invoked = CliRunner().invoke(agent_main, ["eval", "--env", "os", "--tasks", "os.users-add", "--modes", "ppo_local", "--modes-file",
                                              str(modes), "--max-steps", "1", "--lake", lake, "--run-id", "os-eval", "--no-progress"])
    assert invoked.exit_code == 0, invoked.output
    evaluated = Lake.open(lake).query_arrow("select mode, adapter, env from episodes where run_id = 'os-eval-ppo_local'").to_pylist()
    assert evaluated == [{"mode": "ppo_local", "adapter": str(out / "epoch_2"), "env": "os"}]


def test_os_steps_feed_the_existing_views(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    write_os_episodes(lake)
    bc = lake.query_arrow("select count(*) n, count(distinct completion) k from bc_rows").to_pylist()[0]
    assert bc["n"] > 0 and bc["k"] >= 1
    groups = lake.query_arrow("select group_size, zero_std from grpo_groups where level = 'episode' limit 1").to_pylist()
    assert groups == [{"group_size": 6, "zero_std": False}]  # solved and unsolved attempts: a group with spread
    matrix = lake.query_arrow("select site, success_rate from eval_matrix").to_pylist()
    assert matrix == [{"site": "users", "success_rate": 0.5}]
