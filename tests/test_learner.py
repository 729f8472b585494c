"""The persistent online learner: every row trained, one optimizer across updates, exact resume from a version folder."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from halo_data.lake import Lake  # noqa: E402
from halo_train.config import GRPOConfig  # noqa: E402
from halo_train.data import read_view  # noqa: E402
from halo_train.grpo import MEMBERS_SQL, training_members  # noqa: E402
from halo_train.learner import LEARNER_STATE, Learner, LearnerOptions, lora_weights  # noqa: E402
from halo_train.testing import write_fixture_episodes  # noqa: E402

RUN = "fixture-rollout"


@pytest.fixture
def setup(tmp_path, tiny_lora_models):
    torch.set_num_threads(1)
    lake = Lake.init(tmp_path / "lake")
    write_fixture_episodes(lake, run_id=RUN)
    cfg = GRPOConfig(lake=str(tmp_path / "lake"), base_model=tiny_lora_models[0], lr=0.01, lora_r=4, lora_alpha=8,
                     lora_dropout=0.0, target_modules=["q_proj", "v_proj"], runs=[RUN], output_dir=str(tmp_path / "out"))
    return cfg, LearnerOptions(mini_batch_size=8, batch_size=4, warmup_steps=0, target_kl=None)


def weights(learner: Learner) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in learner.model.named_parameters() if "lora_" in n}


def test_an_update_trains_every_row_in_minibatches_and_moves_the_adapter(setup):
    cfg, options = setup
    rows = read_view(cfg.lake, "grpo_groups", view_params={"omega": cfg.omega}, sql=MEMBERS_SQL).table.to_pylist()
    expected = len(training_members(rows, cfg.omega).members)
    learner = Learner.start(cfg, options)
    before = weights(learner)
    first = learner.update(cfg)
    assert first.rows == expected == 16  # every trainable row of the fixture, not a batch of them
    assert first.optimizer_steps == 2 and learner.step == 2 and learner.version == 1  # 16 rows / 8 per step
    assert any(not torch.equal(before[k], v) for k, v in weights(learner).items())
    m = first.metrics
    assert m["displacement_from_base"] > 0 and m["displacement_from_previous"] == pytest.approx(m["displacement_from_base"], rel=1e-4)
    assert m["entropy"] > 0 and m["learning_rate"] == pytest.approx(0.01)  # constant: no decay inside the update
    assert 0 <= m["step_advantage_share"] <= 1 if "step_advantage_share" in m else "step_advantage_share" in first.extra
    # The optimizer carries its moments into the next update instead of starting from zero.
    moments = [s["exp_avg"].abs().sum() for s in learner.optimizer.state.values()]
    assert moments and all(float(v) > 0 for v in moments)
    second = learner.update(cfg)
    assert learner.step == 4 and second.metrics["displacement_from_previous"] > 0
    assert second.metrics["learning_rate"] == pytest.approx(0.01)


def test_target_kl_ends_an_update_before_the_step_that_would_pass_it(tmp_path, tiny_lora_models):
    """--target-kl: a minibatch whose approximate KL(current || sampling policy) is past 1.5 x the target takes no
    step, and the update ends there (its rows untrained, the figures saying so); under a loose target every row
    trains as without one."""
    torch.set_num_threads(1)
    lake = Lake.init(tmp_path / "lake")
    # Stored logprobs far above what the model gives these actions: the policy is already far from the sampler's.
    write_fixture_episodes(lake, run_id=RUN, logprob_fn=lambda prompt, action: -0.01)
    cfg = GRPOConfig(lake=str(tmp_path / "lake"), base_model=tiny_lora_models[0], lr=0.01, lora_r=4, lora_alpha=8,
                     lora_dropout=0.0, target_modules=["q_proj", "v_proj"], runs=[RUN], output_dir=str(tmp_path / "out"))
    strict = Learner.start(cfg, LearnerOptions(mini_batch_size=8, batch_size=4, target_kl=0.01))
    before = weights(strict)
    stopped = strict.update(cfg)
    m = stopped.metrics
    assert m["early_stopped"] == 1.0 and m["stop_kl"] > 1.5 * 0.01
    assert (stopped.optimizer_steps, stopped.rows, m["rows_trained"], strict.step) == (0, 0, 0.0, 0) and m["rows_read"] == 16
    assert all(torch.equal(before[k], v) for k, v in weights(strict).items())  # no step taken
    loose = Learner.start(cfg, LearnerOptions(mini_batch_size=8, batch_size=4, target_kl=1e6))
    trained = loose.update(cfg)
    assert (trained.metrics["early_stopped"], trained.optimizer_steps, trained.rows) == (0.0, 2, 16)
    assert trained.step_log[0]["approx_kl"] > 1.5 * 0.01  # the strict learner's stop was on this KL
    assert LearnerOptions(target_kl=0.0).target_kl is None  # --target-kl 0: no early stop
    with pytest.raises(Exception, match="--target-kl must be positive, or 0 for no early stop"):
        LearnerOptions(target_kl=-0.01)


def dpo_config(cfg: GRPOConfig):
    """The fixture's DPO pairs, trained by the same learner (halo-train mcts's updates)."""
    from halo_train.config import DPOConfig

    return DPOConfig(lake=cfg.lake, base_model=cfg.base_model, lr=0.01, lora_r=4, lora_alpha=8, lora_dropout=0.0,
                     target_modules=["q_proj", "v_proj"], runs=[RUN], beta=0.1, output_dir=cfg.output_dir)


# GRPO: 16 rows at 8 a step; DPO: the fixture's pairs fill one step.
@pytest.mark.parametrize("loss, steps", [("grpo", 2), ("dpo", 1)])
def test_a_resumed_learner_makes_the_same_next_adapter_as_an_uninterrupted_one(setup, tmp_path, loss, steps):
    cfg, options = setup
    if loss == "dpo":
        cfg = dpo_config(cfg)
    uninterrupted = Learner.start(cfg, options)
    uninterrupted.update(cfg)
    uninterrupted.update(cfg)

    interrupted = Learner.start(cfg, options)
    interrupted.update(cfg)
    staging = tmp_path / "out" / ".policy-1.saving"

    def stats() -> str:  # called once the adapter and state are written, before the folder is renamed into place
        assert (staging / LEARNER_STATE).exists() and not (tmp_path / "out" / "policy-1").exists()
        return "written last"

    folder = interrupted.save(tmp_path / "out" / "policy-1", {"training_stats.json": stats, "note.txt": "as given"})
    assert (folder / LEARNER_STATE).exists() and (folder / "adapter_model.safetensors").exists()
    assert (folder / "training_stats.json").read_text() == "written last" and (folder / "note.txt").read_text() == "as given"
    assert not any(p.name.endswith(".saving") for p in folder.parent.iterdir())  # renamed into place when complete
    del interrupted
    resumed = Learner.resume(cfg, options, folder)
    assert (resumed.version, resumed.step) == (1, steps)
    resumed.update(cfg)

    want, got = lora_weights(uninterrupted.model), lora_weights(resumed.model)
    assert want.keys() == got.keys()
    for name, (a, b, _) in want.items():
        assert torch.allclose(a, got[name][0], atol=1e-6, rtol=0) and torch.allclose(b, got[name][1], atol=1e-6, rtol=0), name
    # ... and that is not because the second update did nothing.
    assert any(not torch.allclose(b, lora_weights(Learner.resume(cfg, options, folder).model)[n][1]) for n, (_, b, _) in got.items())


def test_warmup_raises_the_rate_step_by_step_across_updates_and_a_resume(setup, tmp_path):
    """--warmup-steps: the learning rate rises linearly over the run's first optimizer steps, whichever update they
    fall in, and a resumed learner goes on from the step it saved, then holds the rate constant."""
    cfg, _ = setup
    options = LearnerOptions(mini_batch_size=8, batch_size=4, warmup_steps=3)
    learner = Learner.start(cfg, options)
    first = learner.update(cfg)
    assert [s["learning_rate"] for s in first.step_log] == pytest.approx([0.01 / 4, 0.01 * 2 / 4])
    folder = learner.save(tmp_path / "out" / "policy-1")
    resumed = Learner.resume(cfg, options, folder)
    second = resumed.update(cfg)
    assert [s["learning_rate"] for s in second.step_log] == pytest.approx([0.01 * 3 / 4, 0.01])
    assert [s["learning_rate"] for s in resumed.update(cfg).step_log] == pytest.approx([0.01, 0.01])


def test_resume_refuses_a_folder_without_learner_state(setup, tmp_path):
    from halo_train.config import TrainConfigError

    cfg, options = setup
    with pytest.raises(TrainConfigError, match="learner_state.pt"):
        Learner.resume(cfg, options, tmp_path)


def test_the_same_learner_trains_dpo_pairs_with_the_sigmoid_loss(setup):
    from halo_train.config import DPOConfig

    cfg, options = setup
    dpo = dpo_config(cfg)
    learner = Learner.start(dpo, options)
    before = weights(learner)
    result = learner.update(dpo)
    assert result.rows == result.extra["pairs"] > 0 and result.extra["pairs_with_stored_reference"] == 0
    assert any(not torch.equal(before[k], v) for k, v in weights(learner).items())
    # The first step's reference is the base model (the adapter starts at B = 0): the margins start at 0.
    assert result.step_log[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert {"rewards/chosen", "rewards/margins", "rewards/accuracies"} <= result.metrics.keys()
    with pytest.raises(Exception, match="sigmoid"):
        learner.update(DPOConfig(lake=cfg.lake, base_model=cfg.base_model, runs=[RUN], loss_type=["ipo"]))


def test_truncated_importance_sampling_takes_ratios_against_the_trainer_and_caps_the_engines_gap(setup):
    """Stored logprobs from an engine that computes differently (here: the trainer's own, shifted by a known gap):
    with --tis-cap the ratio is taken against the trainer's score before the update (1 at the first step, nothing
    clipped), and each token's loss is weighted by min(pi_trainer / pi_engine, cap)."""
    import math

    from halo_data import prompts
    from halo_train.grpo import GRPOCollator, tokenize_member
    from halo_train.grpo_loss import _processed, batch_loss, clip_range

    cfg, options = setup
    learner = Learner.start(cfg, options)
    tokenizer = learner.tokenizer
    collate = GRPOCollator(tokenizer.pad_token_id)
    rows = []
    for i, text in enumerate(["click('3')", "click('12')"]):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        stored = {"completion_token_ids": ids, "logprobs": [0.0] * len(ids), "logprobs_mode": "processed_logprobs",
                  "draw": "sample", "choices": None, "temperature": 1.0}
        prompt = prompts.dumps([{"role": "user", "content": f"Click button {i}."}])
        encoded = tokenize_member(tokenizer, prompt, text, 64, stored)
        rows.append({**encoded, "advantage": 1.0 - 2 * i, "logprob_sum": None, "episode_reward": 1.0 - i, "episode_group_std": 0.7})
    with torch.no_grad():  # the engine's logprobs: the trainer's, each token 0.5 nats more likely
        batch = collate(rows)
        trainer = _processed(learner.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float(), batch)
    for j, row in enumerate(rows):
        row["token_logprobs"] = [v + 0.5 if m else 0.0 for v, m in zip(trainer[j].tolist(), row["completion_mask"][1:])]
    plain_cfg = cfg
    tis_cfg = GRPOConfig(**{**cfg.to_dict(), "tis_cap": 2.0})

    _, plain = batch_loss(learner.model, collate(rows), plain_cfg, clip_range(plain_cfg))
    assert plain["importance_ratio_mean"] == pytest.approx(math.exp(-0.5), rel=1e-3)  # the engine's gap as a ratio

    learner._score_before_update(rows, collate)
    _, tis = batch_loss(learner.model, collate(rows), tis_cfg, clip_range(tis_cfg))
    assert tis["importance_ratio_mean"] == pytest.approx(1.0, abs=1e-5) and tis["clip_ratio"] == 0.0
    assert tis["engine_log_ratio_mean"] == pytest.approx(0.5, abs=1e-4) and tis["engine_tis_truncated"] == 0.0

    with pytest.raises(Exception, match="persistent learner"):
        from halo_train.grpo import train_grpo

        train_grpo(tis_cfg)


def test_shared_prompts_give_the_full_forwards_loss_and_gradient_with_fewer_tokens_run(setup):
    """A state's rows run its prompt once (its key/value cache repeated for each completion): the loss and every
    LoRA gradient equal the full forward's, and the model embeds fewer tokens."""
    from halo_train.grpo_loss import batch_loss, clip_range, prompt_spans
    from halo_train.learner import _prompt_ids

    cfg, options = setup
    learner = Learner.start(cfg, options)
    rows, collate, _, _, _ = learner._grpo_rows(cfg)
    prompts = {_prompt_ids(r) for r in rows}
    assert len(prompts) < len(rows)  # a group's rows share their state's prompt
    batch = collate(rows)
    assert prompt_spans(batch) is not None
    # Train a little first so that the adapter is not zero (B = 0 at the start makes every LoRA gradient of A zero).
    learner.update(cfg)
    embedded = []
    hook = learner.model.get_input_embeddings().register_forward_hook(lambda m, i, o: embedded.append(i[0].numel()))
    results = {}
    for share in (False, True):
        learner.model.zero_grad(set_to_none=True)
        embedded.clear()
        loss, stats = batch_loss(learner.model, batch, cfg, clip_range(cfg), share_prompts=share)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in learner.model.named_parameters() if p.grad is not None}
        results[share] = (loss.item(), grads, sum(embedded), stats)
    hook.remove()
    (full_loss, full_grads, full_tokens, full_stats), (loss, grads, tokens, stats) = results[False], results[True]
    assert loss == pytest.approx(full_loss, abs=1e-5)
    assert grads.keys() == full_grads.keys() and grads
    for name, g in grads.items():
        torch.testing.assert_close(g, full_grads[name], atol=1e-5, rtol=1e-3)
    assert stats["approx_kl"] == pytest.approx(full_stats["approx_kl"], abs=1e-5)
    assert tokens < full_tokens  # each distinct prompt once, then only the completions
    # The measurement after an update (KL against the stored logprobs, entropy) is the same through shared prompts.
    shared = learner.measure(rows, collate)
    learner.options.share_prompts = False
    full = learner.measure(rows, collate)
    learner.options.share_prompts = True
    assert shared["entropy"] > 0 and shared.keys() == full.keys()
    for key, value in full.items():
        assert shared[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # The learner's passes keep a state's rows together: each minibatch holds whole states where they fit.
    order = learner._epoch_order(rows, [_prompt_ids(r) for r in rows])
    assert sorted(order) == list(range(len(rows)))
    keys = [_prompt_ids(rows[i]) for i in order]
    assert sum(a != b for a, b in zip(keys, keys[1:])) == len(prompts) - 1


def test_adamw_moves_each_weight_by_the_whole_rate_when_fresh_and_less_once_kept_on_noise():
    """What `python -m bench adam-steps` measures: a fresh AdamW's first step moves every weight by the learning rate
    whatever the gradient, so a displacement per update credits a fresh optimizer's first steps; kept across
    updates on pure noise, its steps shrink and their sum grows far slower than their number."""
    from bench.adam_steps import displacements

    params = 400
    (first,) = displacements(0.0, 1, fresh_each_update=True, updates=1, params=params, seed=0)
    assert first == pytest.approx(params ** 0.5, rel=1e-4)   # ±lr on every coordinate
    job = displacements(0.0, 4, fresh_each_update=True, updates=4, params=params, seed=0)
    kept = displacements(0.0, 14, fresh_each_update=False, updates=4, params=params, seed=0)
    assert kept[0] > max(kept[1:])                             # its first update, fresh, moves the most
    ratio = (sum(kept[1:]) / 3) / (sum(job) / 4)
    assert 1.2 < ratio < 2.0                                   # 3.5x the steps, not 3.5x the displacement
