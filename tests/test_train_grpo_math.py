"""Exact tests of GRPO-from-stored-groups: Dr. GRPO advantages, zero-std skipping, staleness and the loss."""

from __future__ import annotations

import math

import pytest
import torch

from halo_data.lake import Lake
from halo_train.data import read_view
from halo_train.grpo import MEMBERS_SQL, compute_advantages, grpo_loss, parse_policy_version, sample_std
from halo_train.testing import write_fixture_episodes


def member(group, episode, reward, mean, std, zero, step_adv=0.0, step_std=0.0, step_zero=True, version="0", step_reward=0.0):
    return {
        "group_key": group, "episode_id": episode, "policy_version": version,
        "episode_reward": reward, "episode_group_mean": mean, "episode_group_std": std,
        "episode_zero_std": zero, "episode_advantage": reward - mean,
        "step_advantage": step_adv, "step_group_std": step_std, "step_zero_std": step_zero, "step_reward": step_reward,
    }


def group(key, rewards, version="0"):
    mean = sum(rewards) / len(rewards)
    std = sample_std(rewards)
    zero = max(rewards) - min(rewards) <= 1e-9
    return [member(key, f"{key}-{i}", r, mean, std, zero, version=version) for i, r in enumerate(rewards)]


def test_dr_grpo_advantage_is_reward_minus_group_mean():
    rows = group("a", [1.0, 0.0, 0.0, 0.5])
    out = compute_advantages(rows, omega=0.0, scale_rewards="none")
    assert [m["advantage"] for m in out.members] == [0.625, -0.375, -0.375, 0.125]


def test_group_scaling_divides_by_group_std_plus_epsilon():
    rows = group("a", [1.0, 0.0])
    out = compute_advantages(rows, omega=0.0, scale_rewards="group")
    std = math.sqrt(0.5)
    assert [m["advantage"] for m in out.members] == pytest.approx([0.5 / (std + 1e-4), -0.5 / (std + 1e-4)], abs=1e-12)


def test_zero_std_groups_are_counted_and_skipped():
    rows = group("a", [1.0, 0.0]) + group("b", [0.3, 0.3, 0.3]) + group("c", [0.0]) + group("d", [2.0, 1.0])
    out = compute_advantages(rows, omega=1.0, scale_rewards="none")
    assert out.episode_groups == 4
    assert out.zero_std_groups == 2  # b (all equal) and c (a single member)
    assert out.frac_reward_zero_std == 0.5
    assert out.skipped_rows == 4
    assert sorted({m["group_key"] for m in out.members}) == ["a", "d"]
    assert [m["advantage"] for m in out.members] == [0.5, -0.5, 0.5, -0.5]


def test_anchor_state_spread_keeps_a_zero_std_episode_group_row():
    rows = [
        member("b", "b-0", 0.3, 0.3, 0.0, True, step_adv=0.2, step_std=0.28, step_zero=False),
        member("b", "b-1", 0.3, 0.3, 0.0, True, step_adv=-0.2, step_std=0.28, step_zero=False),
        member("b", "b-2", 0.3, 0.3, 0.0, True),
    ]
    out = compute_advantages(rows, omega=0.5, scale_rewards="none")
    assert out.zero_std_groups == 1 and out.skipped_rows == 1
    assert [m["advantage"] for m in out.members] == [0.1, -0.1]
    # omega = 0 switches anchor states off: the whole group is skipped.
    assert compute_advantages(rows, omega=0.0).members == []


def test_combined_advantage_matches_the_view(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    write_fixture_episodes(lake)
    read = read_view(str(tmp_path / "lake"), "grpo_groups", view_params={"omega": 0.5}, sql=MEMBERS_SQL)
    rows = read.table.to_pylist()
    out = compute_advantages(rows, omega=0.5, scale_rewards="none")
    assert out.episode_groups == 3 and out.zero_std_groups == 1  # the fixture's last task acts uniformly
    assert out.skipped_rows == 8 and len(out.members) == 16
    for m in out.members:
        assert m["advantage"] == pytest.approx(m["combined_advantage"], abs=1e-12)


def test_policy_versions_and_staleness():
    assert [parse_policy_version(v) for v in (None, "0", "12", "grpo@7", "base", 3)] == [0, 0, 12, 7, 0, 3]
    rows = group("a", [1.0, 0.0], version="2") + group("b", [1.0, 0.0], version="9")
    out = compute_advantages(rows, omega=0.0, max_staleness=5)
    assert out.policy_version == 9
    assert out.stale_rows == 2 and {m["group_key"] for m in out.members} == {"b"}
    assert len(compute_advantages(rows, omega=0.0, policy_version=9, max_staleness=7).members) == 4


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
