"""Reward components: progress milestones per site, novelty, loop, validity, success and their weighted sum."""

from __future__ import annotations

import pytest

from halo_agent.rewards import DEFAULT_CONFIG, EpisodeRewards, RewardConfig, RewardConfigError
from halo_agent.types import Element
from halo_data.config import RewardWeights


@pytest.fixture(scope="module")
def config() -> RewardConfig:
    return RewardConfig.load()


def test_shipped_config_has_the_sites_and_weights(config):
    assert {"miniwob", "gomail", "gocalendar", "omnizon", "generic"} <= set(config.progress)
    assert config.weights == RewardWeights(progress=1.0, novelty=0.05, loop=0.1, validity=0.05, success=1.0)
    assert config.source == str(DEFAULT_CONFIG)


def test_gomail_milestones_follow_the_compose_flow(config):
    r = EpisodeRewards(config, "gomail", start_url="http://gomail.local/", start_state="s0")
    total = sum(m.weight for m in config.progress["gomail"])
    compose = Element("3", "button", "Compose", "click")
    to = Element("8", "textbox", "To", "fill")
    subject = Element("9", "textbox", "Subject", "fill")
    send = Element("12", "button", "Send", "click")

    s1 = r.step(state_hash="s0", action="click('3')", action_valid=True, target=compose, state_hash_after="s1", url_after="http://gomail.local/compose")
    assert s1.milestones == ["compose_opened"]
    assert s1.components["progress"] == pytest.approx(1 / total)
    s2 = r.step(state_hash="s1", action="fill('8', 'kim@x.com')", action_valid=True, target=to, state_hash_after="s2")
    s3 = r.step(state_hash="s2", action="fill('9', 'hi')", action_valid=True, target=subject, state_hash_after="s3")
    assert (s2.milestones, s3.milestones) == (["recipient_filled"], ["subject_filled"])
    s4 = r.step(
        state_hash="s3", action="click('12')", action_valid=True, target=send, state_hash_after="s4",
        page_after="RootWebArea 'GoMail'\n\tStaticText 'Message sent'", env_reward=1.0,
    )
    assert set(s4.milestones) == {"send_clicked", "sent_confirmed"}
    assert s4.cumulative_progress == pytest.approx((total - 0.5) / total)  # body never filled
    assert s4.components["success"] == 1.0

    # a milestone counts once per episode
    again = r.step(state_hash="s4", action="click('3')", action_valid=True, target=compose, state_hash_after="s5")
    assert again.components["progress"] == 0.0


def test_progress_needs_a_valid_action_and_every_rule_to_match(config):
    r = EpisodeRewards(config, "omnizon", start_url="http://omnizon.local/")
    add = Element("5", "button", "Add to Cart", "click")
    failed = r.step(state_hash="a", action="click('5')", action_valid=False, action_error="Timeout", target=add, state_hash_after="a")
    assert failed.components["progress"] == 0.0
    ok = r.step(state_hash="a", action="click('5')", action_valid=True, target=add, state_hash_after="b", url_after="http://omnizon.local/cart")
    assert set(ok.milestones) == {"added_to_cart", "cart_opened"}


def test_unknown_site_uses_generic_rules(config):
    r = EpisodeRewards(config, "gotravel", start_url="http://t.local/")
    step = r.step(state_hash="a", action="click('1')", action_valid=True, target=Element("1", "link", "Flights", "click"),
                  state_hash_after="b", url_after="http://t.local/flights")
    assert set(step.milestones) == {"interacted", "navigated"}


def test_miniwob_rules(config):
    r = EpisodeRewards(config, "miniwob", start_url="file:///x.html")
    filled = r.step(state_hash="a", action="fill('4', 'yes')", action_valid=True, target=Element("4", "textbox", "", "fill"), state_hash_after="b")
    assert set(filled.milestones) == {"interacted", "entered_text"}
    submitted = r.step(state_hash="b", action="click('7')", action_valid=True, target=Element("7", "button", "Submit", "click"), state_hash_after="c")
    assert submitted.milestones == ["submitted"]
    assert submitted.cumulative_progress == pytest.approx(3 / 4)


def test_novelty_loop_and_validity(config):
    r = EpisodeRewards(config, "miniwob", start_state="s0")
    first = r.step(state_hash="s0", action="click('1')", action_valid=True, state_hash_after="s1")
    assert (first.components["novelty"], first.components["loop"], first.components["validity"]) == (1.0, 0.0, 0.2)
    back = r.step(state_hash="s1", action="click('2')", action_valid=True, state_hash_after="s0")
    assert back.components["novelty"] == 0.0  # s0 was the start state
    repeat = r.step(state_hash="s0", action="click('1')", action_valid=True, state_hash_after="s1")
    assert repeat.components["loop"] == -1.0
    unparsed = r.step(state_hash="s1", action=None, action_valid=False, parse_error="no action found", state_hash_after="s1")
    assert unparsed.components["validity"] == -1.0 and unparsed.components["loop"] == 0.0
    refused = r.step(state_hash="s1", action="click('99')", action_valid=False, action_error="no element", state_hash_after="s1")
    assert refused.components["validity"] == -0.5


def test_reward_is_the_weighted_sum(config):
    r = EpisodeRewards(config, "miniwob", start_state="s0")
    step = r.step(state_hash="s0", action="click('1')", action_valid=True, target=Element("1", "button", "ok", "click"),
                  state_hash_after="s1", env_reward=1.0)
    w = config.weights
    expected = (step.components["progress"] * w.progress + step.components["novelty"] * w.novelty
                + step.components["loop"] * w.loop + step.components["validity"] * w.validity + 1.0 * w.success)
    assert step.reward == pytest.approx(expected)
    assert step.reward == pytest.approx(w.shaped(step.components))


def test_bad_configs_name_the_entry():
    with pytest.raises(RewardConfigError, match=r"progress.gomail.x.action: bad regex"):
        RewardConfig.from_dict({"progress": {"gomail": [{"name": "x", "action": "("}]}})
    with pytest.raises(RewardConfigError, match="unknown component"):
        RewardConfig.from_dict({"weights": {"speed": 1}})
    with pytest.raises(RewardConfigError, match="give at least one of"):
        RewardConfig.from_dict({"progress": {"s": [{"name": "empty"}]}})


def test_custom_weights_from_file(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("weights: {success: 2.0}\nvalidity: {valid_action: 0.0}\nprogress: {generic: [{name: any, action: '.'}]}\n")
    cfg = RewardConfig.load(path)
    assert cfg.weights.success == 2.0 and cfg.weights.progress == 1.0 and cfg.valid_action == 0.0
    step = EpisodeRewards(cfg, "x", start_state="a").step(state_hash="a", action="noop()", action_valid=True, state_hash_after="a", env_reward=1.0)
    assert step.components["progress"] == 1.0
    assert step.reward == pytest.approx(1.0 + 2.0)
