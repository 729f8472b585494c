"""Exact tests of GRPO-from-stored-groups: the view's advantages as trained on, scaling, zero-std skipping, staleness and the loss."""

from __future__ import annotations

import math

import pytest
import torch

from halo_data.lake import Lake
from halo_train.config import TrainConfigError
from halo_train.data import read_view
from halo_train.grpo import MEMBERS_SQL, parse_policy_version, sample_std, training_members
from halo_train.grpo_loss import grpo_loss
from halo_train.testing import write_fixture_episodes


def row(level, group, episode, reward, mean, std, zero, combined=None, step_idx=0, version="0"):
    """One grpo_groups row as the view gives it (advantage exactly 0 in a zero-std group)."""
    advantage = 0.0 if zero else reward - mean
    return {"level": level, "group_key": group, "episode_id": episode, "step_idx": step_idx, "policy_version": version,
            "reward": reward, "group_std": std, "zero_std": zero, "advantage": advantage,
            "combined_advantage": advantage if combined is None else combined}


def group(key, rewards, version="0"):
    mean = sum(rewards) / len(rewards)
    zero = max(rewards) - min(rewards) <= 1e-9
    return [row("episode", key, f"{key}-{i}", r, mean, sample_std(rewards), zero, version=version) for i, r in enumerate(rewards)]


def view_rows(tmp_path, omega):
    lake = Lake.init(tmp_path / "lake")
    write_fixture_episodes(lake)
    return read_view(str(tmp_path / "lake"), "grpo_groups", view_params={"omega": omega}, sql=MEMBERS_SQL).table.to_pylist()


def test_the_trainer_trains_on_the_views_combined_advantage(tmp_path):
    rows = view_rows(tmp_path, omega=0.5)
    out = training_members(rows, omega=0.5, scale_rewards="none")
    assert out.episode_groups == 3 and out.zero_std_groups == 1  # the fixture's last task acts uniformly
    assert out.skipped_rows == 8 and len(out.members) == 16
    episode_rows = {(r["episode_id"], r["step_idx"]): r for r in rows if r["level"] == "episode"}
    for m in out.members:
        assert m["advantage"] == episode_rows[m["episode_id"], m["step_idx"]]["combined_advantage"]
    # the zero-std group's rows are the ones skipped: the view gives them exactly 0
    skipped = [r for k, r in episode_rows.items() if k not in {(m["episode_id"], m["step_idx"]) for m in out.members}]
    assert len(skipped) == 8 and all(r["zero_std"] and r["combined_advantage"] == 0.0 for r in skipped)


def test_group_scaling_divides_each_levels_view_advantage_by_its_std(tmp_path):
    omega = 0.5
    rows = view_rows(tmp_path, omega=omega)
    by_level = {(r["level"], r["episode_id"], r["step_idx"]): r for r in rows}
    out = training_members(rows, omega=omega, scale_rewards="group")
    assert len(out.members) == 16
    for m in out.members:
        e, s = (by_level[level, m["episode_id"], m["step_idx"]] for level in ("episode", "step"))
        want = e["advantage"] / (e["group_std"] + 1e-4) + omega * s["advantage"] / (s["group_std"] + 1e-4)
        assert m["advantage"] == pytest.approx(want, abs=1e-12)


def test_group_and_batch_scaling_of_hand_made_rows():
    rows = group("a", [1.0, 0.0])
    std = math.sqrt(0.5)
    out = training_members(rows, omega=0.0, scale_rewards="group")
    assert [m["advantage"] for m in out.members] == pytest.approx([0.5 / (std + 1e-4), -0.5 / (std + 1e-4)], abs=1e-12)
    rows = group("a", [1.0, 0.0]) + group("b", [3.0, 2.0])
    batch_std = sample_std([1.0, 0.0, 3.0, 2.0])
    out = training_members(rows, omega=0.0, scale_rewards="batch")
    assert [m["advantage"] for m in out.members] == pytest.approx([0.5 / (batch_std + 1e-4), -0.5 / (batch_std + 1e-4)] * 2)


def test_zero_std_groups_are_counted_and_skipped():
    rows = group("a", [1.0, 0.0]) + group("b", [0.3, 0.3, 0.3]) + group("c", [0.0]) + group("d", [2.0, 1.0])
    out = training_members(rows, omega=1.0, scale_rewards="none")
    assert out.episode_groups == 4
    assert out.zero_std_groups == 2  # b (all equal) and c (a single member)
    assert out.frac_reward_zero_std == 0.5
    assert out.skipped_rows == 4
    assert sorted({m["group_key"] for m in out.members}) == ["a", "d"]
    assert [m["advantage"] for m in out.members] == [0.5, -0.5, 0.5, -0.5]


def test_anchor_state_spread_keeps_a_zero_std_episode_group_row():
    # episode group b has zero std; two of its steps share an anchor state whose returns differ (A_step = +-0.2)
    rows = [
        row("episode", "b", "b-0", 0.3, 0.3, 0.0, True, combined=0.1),
        row("episode", "b", "b-1", 0.3, 0.3, 0.0, True, combined=-0.1),
        row("episode", "b", "b-2", 0.3, 0.3, 0.0, True),
        row("step", "b|s", "b-0", 0.5, 0.3, 0.28, False),
        row("step", "b|s", "b-1", 0.1, 0.3, 0.28, False),
        row("step", "b|t", "b-2", 0.3, 0.3, 0.0, True),
    ]
    out = training_members(rows, omega=0.5, scale_rewards="none")
    assert out.zero_std_groups == 1 and out.skipped_rows == 1
    assert [m["advantage"] for m in out.members] == [0.1, -0.1]
    scaled = training_members(rows, omega=0.5, scale_rewards="group")
    assert [m["advantage"] for m in scaled.members] == pytest.approx([0.5 * 0.2 / 0.2801, -0.5 * 0.2 / 0.2801])
    # without its step rows, scaling cannot see A_step: an error that says what to keep
    with pytest.raises(TrainConfigError, match="keep level = 'step' in --where"):
        training_members(rows[:3], omega=0.5, scale_rewards="group")


def test_policy_versions_and_staleness():
    assert [parse_policy_version(v) for v in (None, "0", "12", "grpo@7", "base", 3)] == [0, 0, 12, 7, 0, 3]
    rows = group("a", [1.0, 0.0], version="2") + group("b", [1.0, 0.0], version="9")
    out = training_members(rows, omega=0.0, max_staleness=5)
    assert out.policy_version == 9
    assert out.stale_rows == 2 and {m["group_key"] for m in out.members} == {"b"}
    assert len(training_members(rows, omega=0.0, policy_version=9, max_staleness=7).members) == 4


def _loss_inputs():
    token_logps = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.7, -0.2, -1.1, -0.4]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    advantage = torch.tensor([1.0, -1.0])
    return token_logps, mask, advantage


def test_dr_grpo_loss_without_logprobs_is_reinforce_with_constant_normaliser():
    token_logps, mask, advantage = _loss_inputs()
    no = torch.tensor([False, False])
    loss, stats = grpo_loss(token_logps, mask, advantage, torch.zeros(2), no, "dr_grpo", 0.2, 0.2, max_completion_length=4)
    # sum over completion tokens of -A (ratio 1) / (batch 2 x max_completion_length 4)
    assert loss.item() == pytest.approx((-(1.0 * 2) + 1.0 * 1) / 8)
    loss.backward()
    expected = -(advantage.unsqueeze(-1) * mask) / 8
    assert torch.allclose(token_logps.grad, expected)
    assert stats["frac_rows_off_policy"] == 0.0 and stats["completion_length"] == 1.5


def test_grpo_and_bnpo_normalisers():
    token_logps, mask, advantage = _loss_inputs()
    no = torch.tensor([False, False])
    grpo, _ = grpo_loss(token_logps, mask, advantage, torch.zeros(2), no, "grpo", 0.2, 0.2, 4)
    bnpo, _ = grpo_loss(token_logps, mask, advantage, torch.zeros(2), no, "bnpo", 0.2, 0.2, 4)
    assert grpo.item() == pytest.approx(((-2 / 2) + (1 / 1)) / 2)
    assert bnpo.item() == pytest.approx((-2 + 1) / 3)


def test_importance_ratio_is_clipped_against_the_behaviour_policy():
    token_logps, mask, advantage = _loss_inputs()
    yes = torch.tensor([True, True])
    # Row 0: log pi = -3 over 2 tokens; behaviour -4 -> ratio exp(0.5) > 1.2 with A > 0: clipped, no gradient.
    # Row 1: log pi = -0.7 over 1 token; behaviour -0.7 -> ratio 1: gradient -A * 1 / n_tokens.
    behaviour = torch.tensor([-4.0, -0.7])
    loss, stats = grpo_loss(token_logps, mask, advantage, behaviour, yes, "dr_grpo", 0.2, 0.2, 4)
    assert loss.item() == pytest.approx((-(1.2 * 1.0) * 2 + 1.0 * 1.0) / 8, rel=1e-6)
    loss.backward()
    assert torch.all(token_logps.grad[0] == 0)
    assert token_logps.grad[1, 0].item() == pytest.approx(1.0 / 8)
    assert stats["clip_ratio"] == 0.5 and stats["frac_rows_off_policy"] == 1.0
    assert stats["importance_ratio_mean"] == pytest.approx((math.exp(0.5) + 1.0) / 2, rel=1e-6)


def test_the_choice_softmax_loss_is_the_policy_gradient_of_each_states_choice_distribution():
    from halo_train.grpo_loss import choice_softmax_loss

    # Two states: [right, wrong, textbox] and [right, other]; sequence log-probs as the model gives them
    # (most of the raw mass lies outside the page's choices: they sum to far below 1).
    seq = torch.tensor([-4.0, -6.0, -5.0, -3.0, -3.5], dtype=torch.float64, requires_grad=True)
    def tokens():  # two completion tokens each
        return torch.stack([seq / 2, seq / 2], dim=1)

    mask = torch.ones(5, 2)
    group = torch.tensor([0, 0, 0, 1, 1])
    adv = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    share = torch.cat([torch.softmax(seq[:3], 0), torch.softmax(seq[3:], 0)]).detach()
    behaviour = torch.log(share)  # on-policy: every ratio is 1
    loss, stats = choice_softmax_loss(tokens(), mask, group, adv, behaviour, 0.2, 0.2)
    assert float(loss.detach()) == pytest.approx(-(1.0 + 1.0) / 2)
    loss.backward()
    # d loss / d log p(a) = -(A_a - share_a * sum_b A_b) / groups: the right choice rises, and every other
    # choice of its page falls in proportion to its share, advantage 0 or not.
    want = -(adv - share * torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)) / 2
    assert torch.allclose(seq.grad, want)
    assert seq.grad[1] > 0 and seq.grad[2] > 0 and seq.grad[0] < 0
    assert stats["positive_choice_share"] == pytest.approx(float((share[0] + share[3]) / 2))
    assert stats["importance_ratio_mean"] == pytest.approx(1.0) and stats["clip_ratio"] == 0.0
    # Past 1 + epsilon the positive row is clipped and carries no gradient.
    seq.grad = None
    loss, stats = choice_softmax_loss(tokens(), mask, group, adv, behaviour - 1.0, 0.2, 0.2)
    loss.backward()
    assert stats["clip_ratio"] == 1.0 and torch.all(seq.grad == 0)

