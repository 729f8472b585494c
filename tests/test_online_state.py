"""Per-state GRPO groups: the state_groups view over `candidates`, `halo-train grpo --group-by state`, and
`halo-train online-grpo --group-by state` end to end (a tiny model served by HALO's chat server, MiniWoB++ in
Chromium, candidates executed from states restored by replay)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from halo_data import ids, prompts
from halo_data.lake import Lake
from halo_data.writer import append_rows
from halo_train.testing import chat_server_in_process

TASKS = ["click-button", "click-test"]


def query(lake: str, sql: str) -> list[dict]:
    return Lake.open(lake).query_arrow(sql).to_pylist()


def prompt_for(name: str) -> str:
    return prompts.dumps(prompts.render_messages("click the button", f"http://site/{name}", f"[12] button '{name}'"))


def candidate_rows(run_id: str, episode_id: str, step_idx: int, state: str, scores, *, version="0", source="env",
                   outputs=None) -> list[dict]:
    p = prompt_for(state)
    outputs = outputs or [f"click('{10 + i}')" for i in range(len(scores))]
    return [
        dict(run_id=run_id, env="miniwob", episode_id=episode_id, task_id="miniwob.click-button", step_idx=step_idx,
             state_hash=f"h-{state}", candidate_idx=i, prompt=p, prompt_hash=ids.sha256_hex(p), model_output=out,
             action=out, score=score, score_source=source if score is not None else "unreproducible",
             policy_version=version, logprob_sum=-1.5 - i)
        for i, (out, score) in enumerate(zip(outputs, scores))
    ]


@pytest.fixture
def candidates_lake(tmp_path) -> str:
    """Four states of run r: one with a spread, one flat, one that did not reproduce, one sampled by version 3."""
    lake = Lake.init(tmp_path / "lake")
    append_rows(lake, "candidates", [
        *candidate_rows("r", "e1", 0, "s0", [1.0, 0.0, 0.5, 0.5]),
        *candidate_rows("r", "e1", 1, "s1", [0.2, 0.2, 0.2]),
        *candidate_rows("r", "e2", 0, "s2", [None, None, None, None]),
        *candidate_rows("r", "e3", 0, "s3", [0.0, 0.9], version="3"),
    ])
    return str(lake.root)


# ---------------------------------------------------------------------- the view


def test_state_groups_have_their_mean_std_and_advantages_and_no_unreproducible_state(candidates_lake):
    got = query(candidates_lake, "select group_key, episode_id, step_idx, candidate_idx, score, group_mean, group_std, "
                                 "group_min, group_size, zero_std, advantage, completion, logprob_sum, policy_version "
                                 "from state_groups order by group_key, candidate_idx")
    assert {r["episode_id"] for r in got} == {"e1", "e3"}  # e2's state did not reproduce: none of its candidates
    spread = [r for r in got if r["group_key"] == "r|e1|0|h-s0|0"]
    std = math.sqrt(sum((x - 0.5) ** 2 for x in (1.0, 0.0, 0.5, 0.5)) / 3)
    assert [(r["score"], r["group_mean"], r["advantage"]) for r in spread] == [
        (1.0, 0.5, 0.5), (0.0, 0.5, -0.5), (0.5, 0.5, 0.0), (0.5, 0.5, 0.0)]
    assert all(r["group_std"] == pytest.approx(std) and r["group_size"] == 4 and not r["zero_std"] for r in spread)
    assert {r["group_min"] for r in spread} == {0.0}
    assert [r["completion"] for r in spread] == ["click('10')", "click('11')", "click('12')", "click('13')"]
    assert [r["logprob_sum"] for r in spread] == [-1.5, -2.5, -3.5, -4.5]
    flat = [r for r in got if r["group_key"] == "r|e1|1|h-s1|0"]
    assert [(r["group_size"], r["zero_std"], r["advantage"]) for r in flat] == [(3, True, 0.0)] * 3
    v3 = [r for r in got if r["episode_id"] == "e3"]
    assert [(r["policy_version"], r["advantage"]) for r in v3] == [("3", pytest.approx(-0.45)), ("3", pytest.approx(0.45))]


def test_one_unreproducible_candidate_flags_its_whole_state(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    rows = candidate_rows("r", "e1", 0, "s0", [1.0, 0.0, 0.5])
    rows[1].update(score=None, score_source="unreproducible")
    append_rows(lake, "candidates", rows)
    assert query(str(lake.root), "select count(*) n from state_groups") == [{"n": 0}]


# ---------------------------------------------------------------------- the trainer


@pytest.fixture(scope="session")
def untrained_tiny(build_once) -> str:
    from halo_train.tiny_model import build_tiny_model

    return build_once("online-state-untrained", lambda root: str(build_tiny_model(root / "tiny")))


def test_grpo_group_by_state_trains_on_the_fresh_state_groups(candidates_lake, untrained_tiny, tmp_path):
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from halo_train.cli import main

    out = tmp_path / "grpo"
    result = CliRunner().invoke(main, [
        "grpo", "--group-by", "state", "--lake", candidates_lake, "--base-model", untrained_tiny, "--output-dir", str(out),
        "--max-steps", "1", "--lr", "0.01", "--policy-version", "3", "--max-staleness", "1", "--run-id", "grpo-state"])
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "final" / "training_stats.json").read_text())
    # Version 3 trains: the v0 states (7 rows) are too stale, v3's one state (2 rows, a spread) is the batch.
    assert (stats["source_view"], stats["group_by"], stats["state_groups"], stats["stale_rows"], stats["rows"]) == (
        "state_groups", "state", 1, 7, 2)
    assert stats["rows_with_behaviour_logprobs"] == 2 and stats["policy_version"] == "4"
    weights = load_file(str(out / "final" / "adapter_model.safetensors"))
    assert any(float(w.abs().max()) > 0 for k, w in weights.items() if "lora_B" in k)  # zero-initialised, now trained
    metrics = {r["metric"] for r in query(candidates_lake, "select metric from train_metrics where run_id = 'grpo-state'")}
    assert {"loss", "importance_ratio_mean", "clip_ratio"} <= metrics


def test_choice_groups_hold_each_distinct_completion_once_with_its_behaviour_share(untrained_tiny):
    from transformers import AutoTokenizer

    from halo_train.config import GRPOConfig
    from halo_train.grpo import choice_groups

    prompt = '[{"role": "user", "content": "Goal: click Yes"}]'

    def member(key, completion, advantage, logprob):
        return {"group_key": key, "prompt": prompt, "completion": completion, "advantage": advantage,
                "logprob_sum": logprob, "reward": advantage, "group_std": 0.5}

    cfg = GRPOConfig(group_by="state", choice_softmax=True, lake="lake", base_model="m")
    items, dropped = choice_groups([
        member("a", "# 'Yes'\nclick('1')", 1.0, -2.0), member("a", "# textbox\nclick('2')", 0.0, -3.0),
        member("a", "# 'Yes'\nclick('1')", 0.5, -2.0),                              # drawn twice: one choice
        member("b", "# 'No'\nclick('4')", 0.0, -1.0), member("b", "# 'Ok'\nclick('5')", 0.0, -1.0),  # no spread
        member("c", "# 'Ok'\nclick('5')", 1.0, -1.0), member("c", "# textbox\nclick('6')", 0.0, None),  # unscored
    ], AutoTokenizer.from_pretrained(untrained_tiny), cfg)
    assert dropped == 0 and len(items) == 1
    (item,) = items
    assert item["advantage"] == [0.75, 0.0] and len(item["input_ids"]) == 2
    norm = math.log(math.exp(-2.0) + math.exp(-3.0))
    assert item["logprob_sum"] == pytest.approx([-2.0 - norm, -3.0 - norm])
    assert sum(math.exp(x) for x in item["logprob_sum"]) == pytest.approx(1.0)


def test_grpo_choice_softmax_trains_whole_state_groups(candidates_lake, untrained_tiny, tmp_path):
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from halo_train.cli import main

    out = tmp_path / "grpo"
    result = CliRunner().invoke(main, [
        "grpo", "--group-by", "state", "--state-baseline", "min", "--choice-softmax", "--lake", candidates_lake,
        "--base-model", untrained_tiny, "--output-dir", str(out), "--where", "episode_id = 'e1'", "--max-steps", "2",
        "--lr", "0.01", "--run-id", "grpo-choice"])
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "final" / "training_stats.json").read_text())
    # s0's four candidates are one item: the one at the group's minimum stays, in its group's normaliser.
    assert (stats["skipped_rows"], stats["zero_advantage_rows"], stats["rows"], stats["rows_with_behaviour_logprobs"]) == (3, 0, 1, 4)
    weights = load_file(str(out / "final" / "adapter_model.safetensors"))
    assert any(float(w.abs().max()) > 0 for k, w in weights.items() if "lora_B" in k)
    metrics = {r["metric"]: r["value"] for r in query(candidates_lake, "select metric, value from train_metrics where run_id = 'grpo-choice'")}
    assert 0 < metrics["positive_choice_share"] < 1 and metrics["frac_rows_off_policy"] == 1.0


@pytest.mark.parametrize("extra, rows, zero_rows", [
    ([], 2, 2),                   # s0 [1, 0, .5, .5] against its mean .5: the two .5 rows carry no gradient
    (["--beta", "0.1"], 4, 0),    # with a KL term every row of a spread state still counts
])
def test_rows_with_advantage_zero_take_no_batch_slot_without_a_kl_term(candidates_lake, untrained_tiny, tmp_path, extra,
                                                                       rows, zero_rows):
    from click.testing import CliRunner

    from halo_train.cli import main

    out = tmp_path / "grpo"
    result = CliRunner().invoke(main, [
        "grpo", "--group-by", "state", "--lake", candidates_lake, "--base-model", untrained_tiny, "--output-dir", str(out),
        "--where", "episode_id = 'e1'", "--max-steps", "1", "--run-id", "grpo-zero", *extra])
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "final" / "training_stats.json").read_text())
    # s1 is flat (3 rows skipped); of s0's 4 rows, those at the mean are left out unless --beta needs them.
    assert (stats["skipped_rows"], stats["zero_advantage_rows"], stats["rows"]) == (3, zero_rows, rows)


def test_grpo_group_by_state_without_signal_says_what_to_collect(candidates_lake, untrained_tiny, tmp_path):
    from click.testing import CliRunner

    from halo_train.cli import main

    def error(lake: str, *extra: str) -> str:
        result = CliRunner().invoke(main, ["grpo", "--group-by", "state", "--lake", lake, "--base-model", untrained_tiny,
                                           "--output-dir", str(tmp_path / "o"), *extra])
        assert result.exit_code != 0 and "Traceback" not in result.output
        return [line for line in result.output.splitlines() if line.strip()][-1]

    flat = error(candidates_lake, "--where", "episode_id = 'e1' and step_idx = 1")
    assert flat.startswith("Error: no GRPO rows with a reward signal: all 1 state group(s) have zero reward std: "
                           "sample more candidates per state"), flat
    empty = error(str(Lake.init(tmp_path / "empty").root))
    assert empty.startswith("Error: no per-state groups: sample and score candidates at every state "
                            "(halo-agent rollout --candidates 8)"), empty


def test_state_members_scale_and_skip_flat_states():
    from halo_train.grpo import state_members

    rows = [dict(level="state", group_key=g, policy_version="0", reward=r, group_std=s, group_min=m, zero_std=z,
                 advantage=a, logprob_sum=None)
            for g, r, s, m, z, a in [("a", 1.0, 0.5, 0.5, False, 0.25), ("a", 0.5, 0.5, 0.5, False, -0.25),
                                     ("b", 0.2, 0.0, 0.2, True, 0.0)]]
    none = state_members(rows)
    assert [m["advantage"] for m in none.members] == [0.25, -0.25]
    assert (none.episode_groups, none.zero_std_groups, none.skipped_rows) == (2, 1, 1)
    group = state_members(rows, "group")
    assert [m["advantage"] for m in group.members] == [pytest.approx(0.25 / 0.5001), pytest.approx(-0.25 / 0.5001)]
    # Against the group's lowest score (enumerated actions): nothing is pushed down, the flat state still skipped.
    lowest = state_members(rows, baseline="min")
    assert [m["advantage"] for m in lowest.members] == [0.5, 0.0] and lowest.skipped_rows == 1


def test_the_min_baseline_keeps_a_goal_blind_policy_spread_where_the_mean_collapses_it():
    """Every action of a page enumerated at each state, the policy blind to the goal (one set of logits).
    Goal 2 has two right actions, so its group mean is higher: against the mean, the summed push drives the
    actions that are wrong most often to probability 0 and never stops (-mean x sum of log pi over all actions);
    against the group's lowest score it is a likelihood of the right actions, maximised by a spread policy."""
    torch = pytest.importorskip("torch")

    right = {"1": {"tab1"}, "2": {"tab2", "tablist"}, "3": {"tab3"}}
    actions = ["tablist", "tab1", "tab2", "tab3"]
    goals = ["1", "2", "2", "3"]  # goal 2 drawn more often, as in a short run

    from halo_train.grpo import state_members

    rows = []
    for i, g in enumerate(goals):  # the state_groups rows of each state: score, group mean/std/min, score - mean
        scores = [1.0 if a in right[g] else 0.0 for a in actions]
        mean = sum(scores) / len(scores)
        rows += [dict(level="state", group_key=f"s{i}", policy_version="0", completion=a, reward=x, group_std=0.5,
                      group_min=min(scores), zero_std=False, advantage=x - mean, logprob_sum=None)
                 for a, x in zip(actions, scores)]

    def train(baseline: str) -> list[float]:
        members = state_members(rows, baseline=baseline).members
        index = torch.tensor([actions.index(m["completion"]) for m in members])
        advantage = torch.tensor([m["advantage"] for m in members])
        logits = torch.zeros(len(actions), requires_grad=True)
        opt = torch.optim.Adam([logits], lr=0.1)
        for _ in range(300):
            loss = -(advantage * torch.log_softmax(logits, 0)[index]).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return torch.softmax(logits, 0).tolist()

    mean, lowest = train("mean"), train("min")
    assert mean[actions.index("tab1")] < 0.01 and mean[actions.index("tab3")] < 0.01
    assert min(lowest) > 0.1  # every right action keeps its share: room for the goal to decide


# ---------------------------------------------------------------------- online


@pytest.fixture(scope="session")
def tiny(build_once) -> str:
    """A tiny model warmed up on random-policy steps, so its answers parse as actions and candidates differ."""
    pytest.importorskip("torch")
    from halo_train.testing import warm_tiny_model

    return build_once("warm-" + "-".join(TASKS), lambda root: warm_tiny_model(root, TASKS))  # test_online_grpo's too


@pytest.mark.browser
@pytest.mark.slow
def test_one_online_iteration_by_state_samples_scores_trains_and_reloads(tiny, tmp_path):
    from safetensors.torch import load_file

    from halo_train.online import OnlineConfig, run_online

    with chat_server_in_process(tiny) as url:
        cfg = OnlineConfig(base_model=tiny, tasks=TASKS, iterations=1, group_by="state", candidates_per_state=4,
                           group_size=1, seeds_per_iteration=2, max_episode_steps=2, train_steps=1, mini_batch_size=64,
                           lr=0.01, max_tokens=24, lake=str(tmp_path / "lake"), output_dir=str(tmp_path / "out"),
                           run_id="online", progress=False, engine_url=url)  # one step over every trainable row
        lines: list[str] = []
        summary = run_online(cfg, echo=lines.append)
    lake = cfg.lake

    # Every state the episodes visited has its 4 candidates, tagged with the version that sampled them (0).
    cands = query(lake, "select episode_id, step_idx, candidate_idx, model_output, action, score, score_source, "
                        "policy_version, prompt, logprob_sum from candidates order by episode_id, step_idx, candidate_idx")
    steps = query(lake, "select episode_id, step_idx, model_output, prompt, logprob_sum from steps where run_id = 'online-k0'")
    assert cands and {(c["episode_id"], c["step_idx"]) for c in cands} == {(s["episode_id"], s["step_idx"]) for s in steps}
    assert {c["policy_version"] for c in cands} == {"0"} and {c["candidate_idx"] for c in cands} == {0, 1, 2, 3}
    assert {c["score_source"] for c in cands} <= {"env", "unreproducible"}
    # The episode went on with the call's first sample, and each candidate was sampled from the step's prompt.
    first = {(c["episode_id"], c["step_idx"]): c for c in cands if c["candidate_idx"] == 0}
    assert all(first[(s["episode_id"], s["step_idx"])]["model_output"] == s["model_output"] for s in steps)
    assert all(first[(s["episode_id"], s["step_idx"])]["prompt"] == s["prompt"] for s in steps)
    # Each candidate carries its own sampled-token logprob (the first one's is its step's: the same sample).
    assert all(c["logprob_sum"] is not None and c["logprob_sum"] < 0 for c in cands)
    assert all(first[(s["episode_id"], s["step_idx"])]["logprob_sum"] == s["logprob_sum"] for s in steps)

    # The update read this iteration's state groups, and only those with a spread.
    it = summary.iterations[0]
    assert it["update"] == "trained", lines
    groups = query(lake, "select group_key, any_value(zero_std) z, count(*) n from state_groups "
                         "where run_id = 'online-k0' group by group_key")
    trainable = [g for g in groups if not g["z"]]
    stats = json.loads((Path(it["adapter"]) / "training_stats.json").read_text())
    assert (stats["source_view"], stats["group_by"]) == ("state_groups", "state")
    assert "online-k0" in stats["where"] and stats["rows"] == sum(g["n"] for g in trainable)
    assert it["metrics"]["trainable_groups"] == len(trainable)
    unreproducible = {(c["episode_id"], c["step_idx"]) for c in cands if c["score_source"] == "unreproducible"}
    assert it["metrics"]["unreproducible_states"] == len(unreproducible)  # counted in train_metrics, never trained on
    assert it["metrics"]["frac_reward_zero_std"] == pytest.approx(1 - len(trainable) / len(groups))
    assert "importance_ratio_mean" in it["metrics"]  # against the candidates' stored logprobs
    # Trained (LoRA B starts at zero), saved as policy-1 and reloaded into the engine.
    weights = load_file(str(Path(cfg.output_dir) / "policy-1" / "adapter_model.safetensors"))
    assert any(float(w.abs().max()) > 0 for k, w in weights.items() if "lora_B" in k)
    assert summary.served == "online-policy-1" and "-> policy-1, reload" in lines[0]
    run = query(lake, "select source_view, status from runs where run_id = 'online'")[0]
    assert run == {"source_view": "state_groups", "status": "finished"}


@pytest.mark.browser
@pytest.mark.slow
def test_covering_the_choices_groups_each_offered_action_once_per_state(tiny, tmp_path):
    import re

    from halo_train.online import OnlineConfig, run_online

    with chat_server_in_process(tiny) as url:
        cfg = OnlineConfig(base_model=tiny, tasks=TASKS, iterations=1, group_by="state", candidates_per_state=8,
                           cover_choices=True, constrain_actions=True, observation="elements", group_size=1,
                           seeds_per_iteration=2, max_episode_steps=2, train_steps=1, lr=0.01, max_tokens=24,
                           lake=str(tmp_path / "lake"), output_dir=str(tmp_path / "out"), run_id="online", progress=False,
                           engine_url=url)
        lines: list[str] = []
        summary = run_online(cfg, echo=lines.append)
    cands = query(cfg.lake, "select episode_id, step_idx, candidate_idx, action, model_output, score, logprob_sum, prompt, "
                            "completion_token_ids, choices from candidates order by episode_id, step_idx, candidate_idx")
    steps = query(cfg.lake, "select episode_id, step_idx, action, prompt from steps where run_id = 'online-k0'")
    grouped = 0
    for s in steps:
        page = json.loads(s["prompt"])[-1]["content"]
        offered = {f"click('{bid}')" for bid in re.findall(r"^\[([^\]]+)\] ", page, flags=re.M)}
        actions = [c["action"] for c in cands if (c["episode_id"], c["step_idx"]) == (s["episode_id"], s["step_idx"])]
        if len(offered) == 1:  # a page with one action (click-test) has nothing to compare it with: no group
            assert actions == []
            continue
        grouped += 1
        # The step's own draw first, then every other action the page offers, each once, with its logprob.
        assert actions[0] == s["action"] and len(set(actions)) == len(actions)
        assert set(actions) == offered if len(offered) <= 8 else (len(actions) == 8 and set(actions) <= offered)
    assert grouped >= 2 and all(c["completion_token_ids"] and c["model_output"] in c["choices"] for c in cands)
    # The drawn action has the masked draw's logprob; a covered one, forced by a one-choice request (every token
    # forced: logprob 0 under processed logprobs), is stored without one and trained under the page's draw.
    assert all((c["logprob_sum"] is not None and c["logprob_sum"] < 0) == (c["candidate_idx"] == 0) for c in cands)
    # Every offered action was scored, so a page with one right element always has a spread to learn from.
    it = summary.iterations[0]
    assert it["update"] == "trained" and it["metrics"]["trainable_groups"] >= 1, lines
    assert query(cfg.lake, "select status from runs where run_id = 'online'") == [{"status": "finished"}]


@pytest.mark.parametrize("args, message", [
    (["online-grpo", "--serve", "--group-by", "state", "--candidates-per-state", "1"],
     "Error: --candidates-per-state must be at least 2, got 1"),
    (["grpo", "--state-baseline", "min"],
     "Error: --state-baseline min compares the candidates of a state: add --group-by state"),
    (["online-grpo", "--serve", "--cover-choices", "--constrain-actions"],
     "Error: --cover-choices makes each state's group of the page's choices: add --group-by state and --constrain-actions"),
    (["grpo", "--choice-softmax"], "Error: --choice-softmax normalises over a state's candidates: add --group-by state"),
    (["online-grpo", "--serve", "--group-by", "state", "--choice-softmax"],
     "Error: --choice-softmax trains the share of a state's constrained choices: add --group-by state and --constrain-actions"),
    (["grpo", "--group-by", "state", "--view", "grpo_groups"],
     "Error: grpo reads the state_groups view (its group columns) with --group-by state; got --view grpo_groups: "
     "pass --group-by episode instead"),
])
def test_bad_input_is_one_error_line(untrained_tiny, tmp_path, args, message):
    from click.testing import CliRunner

    from halo_train.cli import main

    result = CliRunner().invoke(main, [*args, "--base-model", untrained_tiny, "--lake", str(tmp_path / "lake"),
                                       "--output-dir", str(tmp_path / "out")])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith(message), result.output
    assert "Traceback" not in result.output
    assert not any((tmp_path / "out").glob("policy-*"))
