"""The hierarchical policy end to end: MiniWoB++ pages in headless Chromium, a real lake, and HALO's chat server
serving a tiny model taught to answer as a manager (and, through LoRA adapters, to answer emptily or off-format).

The worker is a HALO policy: the random one at temperature 0 (always the page's first element, which on
click-dialog is the dialog itself: a loop), or the openai policy against the same chat server.
"""

from __future__ import annotations

import json
import logging

import pytest

torch = pytest.importorskip("torch")

from halo_data import prompts  # noqa: E402
from halo_data.lake import Lake  # noqa: E402
from halo_data.writer import EpisodeWriter  # noqa: E402

from halo_agent.chat_server import ChatCompletionServer  # noqa: E402
from halo_agent.costs import estimate_cost  # noqa: E402
from halo_agent.hierarchy import parse_advice  # noqa: E402
from halo_agent.policies.hf_policy import LocalChatModel  # noqa: E402
from halo_agent.rollout import RolloutConfig, run_rollouts  # noqa: E402
from test_openai_policy import _teach  # noqa: E402

pytestmark = pytest.mark.slow

ADVICE = "PLAN: Close the dialog.\nSUBGOAL: Click the Close button."
STEPS = "select step_idx, action_source, macro, action, action_valid, prompt, model_output, parse_error, prompt_tokens, completion_tokens, " \
        "call_model, cost_usd, success from steps where run_id = $r order by attempt_idx, step_idx"


def _manager_prompts():
    page = "RootWebArea 'Task'\n\t[17] dialog ''\n\t\t[20] button 'Close'"
    return [prompts.text_only(prompts.render_manager_messages("Close the dialog box by clicking the \"x\".", "file:///t.html", page,
                                                               reason=reason)) for reason in ("start", "loop")]


def _prompts_the_tests_send(root, base) -> list:
    """The manager prompts these tests' rollouts send (start and loop on click-dialog's first seed), read back
    from a scratch lake after one rollout against the untaught model: greedy decoding of a model this small is
    only certain on prompts it was taught, and the page text is MiniWoB's, not a copy kept here."""
    with ChatCompletionServer(LocalChatModel(base, device="cpu"), served_model_name="tiny") as server:
        _, steps = rollout(root / "scratch", "prompts", max_steps=5, manager={"model": "tiny", "base_url": server.url})
    sent = [json.loads(s["prompt"]) for s in steps if s["action_source"] == "manager"]
    assert len(sent) == 2, [s["action_source"] for s in steps]
    return sent


@pytest.fixture(scope="module")
def manager_server(tmp_path_factory):
    """Base model: well-formed advice. Adapters: ``mute`` answers nothing, ``rambler`` off-format text."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_train.tiny_model import build_tiny_model

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("manager")
    base = build_tiny_model(root / "base")
    tokenizer = AutoTokenizer.from_pretrained(base)
    taught = _manager_prompts() + _prompts_the_tests_send(root, base)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base)
    assert _teach(model, tokenizer, ADVICE, steps=120, prompts=taught) < 0.1
    model.save_pretrained(base)
    adapters = {}
    for name, answer in (("mute", ""), ("rambler", "Not sure.")):
        config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "lm_head"], ensure_weight_tying=True)
        lora = get_peft_model(AutoModelForCausalLM.from_pretrained(base), config)
        assert _teach(lora, tokenizer, answer, steps=80, lr=1e-2, prompts=taught) < 0.1
        lora.save_pretrained(root / name, save_embedding_layers=True)
        adapters[name] = str(root / name)
    with ChatCompletionServer(LocalChatModel(base, adapters=adapters, device="cpu"), served_model_name="tiny") as server:
        yield server


def rollout(lake, run_id, task="click-dialog", attempts=1, max_steps=4, model=None, **options):
    config = RolloutConfig(env="miniwob", tasks=[task], rollouts_per_task=attempts, policy="hierarchy", temperature=0.0, model=model,
                           policy_options={"worker": "random", **options}, lake=str(lake), run_id=run_id, progress=False,
                           max_steps=max_steps)
    summary = run_rollouts(config)
    return summary, Lake.open(lake).query_arrow(STEPS, {"r": run_id}).to_pylist()


def test_a_loop_calls_the_manager_then_recovery_breaks_it(tmp_path, manager_server):
    summary, steps = rollout(tmp_path / "lake", "loop", max_steps=5, manager={"model": "tiny", "base_url": manager_server.url})
    # the first click on the dialog moves the focus; the next two leave the page as it was: a loop
    assert [(s["action_source"], s["macro"]) for s in steps] == [
        ("manager", None), ("worker", None), ("worker", None), ("worker", None), ("manager", None), ("recovery", "clear_obstruction")]
    assert steps[1]["action"] == steps[2]["action"] == steps[3]["action"]
    assert "Called because: start" in steps[0]["prompt"] and "Called because: loop" in steps[4]["prompt"]
    assert steps[0]["parse_error"] is None and steps[4]["parse_error"] is None  # both answers were advice
    advice = parse_advice(steps[0]["model_output"]).for_worker()
    assert advice and f"Plan: {advice}" in steps[1]["prompt"]  # it reached the worker
    assert steps[5]["action"] != steps[3]["action"] and summary.successes == 1


@pytest.mark.parametrize("adapter, what", [("mute", "empty"), ("rambler", "malformed")])
def test_an_empty_or_malformed_manager_answer_leaves_the_worker_going_with_one_warning(tmp_path, manager_server, caplog, adapter, what):
    caplog.set_level(logging.WARNING, logger="halo_agent.hierarchy.manager")
    _, steps = rollout(tmp_path / "lake", "mute", max_steps=2, recovery=False,
                       manager={"model": "tiny", "adapter": adapter, "base_url": manager_server.url})
    assert [s["action_source"] for s in steps] == ["manager", "worker", "worker"]
    assert steps[0]["parse_error"].startswith(f"manager answer {what}")
    assert "Plan:" not in steps[1]["prompt"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and what in warnings[0].getMessage()


def test_cost_accounting_sums_to_the_tokens_the_server_reported(tmp_path, manager_server, monkeypatch):
    prices = tmp_path / "prices.yaml"
    prices.write_text("default: {input: 0, output: 0}\nmodels:\n  tiny: {input: 1000, output: 4000}\n")
    monkeypatch.setenv("HALO_PRICES", str(prices))
    manager_server.received.clear()
    _, steps = rollout(tmp_path / "lake", "costs", max_steps=3, manager_every=1, recovery=False, worker="openai",
                       model="tiny", worker_options={"base_url": manager_server.url, "max_tokens": 16},
                       manager={"model": "tiny", "base_url": manager_server.url})
    reported = [r["usage"] for r in manager_server.received]
    called = [s for s in steps if s["call_model"]]
    assert len(called) == len(reported) == 6  # a manager and a worker call at each of 3 steps
    for key in ("prompt_tokens", "completion_tokens"):
        assert sum(s[key] for s in called) == sum(u[key] for u in reported)
    assert sum(s["cost_usd"] for s in called) == pytest.approx(
        sum(estimate_cost("tiny", u["prompt_tokens"], u["completion_tokens"]) for u in reported))
    assert sum(s["cost_usd"] for s in called) == pytest.approx(
        sum(u["prompt_tokens"] * 1000 + u["completion_tokens"] * 4000 for u in reported) / 1e6)


def solved_once(lake) -> dict:
    """Run click-dialog once with the close_modal macro (a success); its first step row."""
    summary, steps = rollout(lake, "macros", max_steps=2, macros=True)
    assert summary.successes == 1 and [(s["action_source"], s["macro"]) for s in steps] == [("macro", "close_modal")]
    return Lake.open(lake).query_arrow("select * from steps where run_id = 'macros'").to_pylist()[0]


def test_a_cache_hit_replays_the_verified_action_without_calling_the_worker(tmp_path, manager_server):
    lake = tmp_path / "lake"
    first = solved_once(lake)
    version = Lake.open(lake).versions()["steps"]
    manager_server.received.clear()
    worker = dict(worker="openai", model="tiny", worker_options={"base_url": manager_server.url, "max_tokens": 16})
    summary, steps = rollout(lake, "cached", cache=True, **worker)
    assert [(s["action_source"], s["action"]) for s in steps] == [("cache", first["action"])] and summary.successes == 1
    assert list(manager_server.received) == []  # the worker's model was never called
    runs = {r["run_id"]: r for r in Lake.open(lake).query_arrow("select run_id, lineage, config from runs").to_pylist()}
    assert json.loads(runs["cached"]["lineage"]) == {"steps": version}
    # the same snapshot version, after more rows landed, replays the same actions
    _, again = rollout(lake, "pinned", cache=True, cache_version=version, **worker)
    assert [(s["action_source"], s["action"]) for s in again] == [("cache", first["action"])]


def test_a_failed_cached_action_is_invalidated_and_not_used_again(tmp_path, manager_server):
    lake = tmp_path / "lake"
    first = solved_once(lake)
    # two earlier successes that, from this page, filled the Close button (which cannot be filled) and moved on
    keep = ("url", "goal", "observation", "state_hash", "prompt")
    with EpisodeWriter(Lake.open(lake)) as writer:
        for attempt in range(2):
            writer.write_episode(
                {"run_id": "forged", "env": "miniwob", "task_id": first["task_id"], "site": "miniwob", "task_seed": 0,
                 "attempt_idx": attempt, "success": True, "terminated": True, "task_reward": 1.0},
                [{**{k: first[k] for k in keep}, "action": "fill('20', 'x')", "action_valid": True},
                 {"url": first["url"], "state_hash": "elsewhere", "action": "click('1')", "action_valid": True, "r_success": 1.0}])
    manager_server.received.clear()
    summary, steps = rollout(lake, "replays", attempts=2, cache=True, worker="openai", model="tiny",
                             worker_options={"base_url": manager_server.url, "max_tokens": 16})
    assert [(s["action_source"], s["action"], s["action_valid"]) for s in steps] == [
        ("cache", "fill('20', 'x')", False), ("cache", first["action"], True),  # failed, invalidated, the next entry
        ("cache", first["action"], True)]  # the next episode of the run never tries it again
    assert summary.successes == 2 and list(manager_server.received) == []
    cached = Lake.open(lake).query_arrow("select action from verified_actions where scope = 'task' and state_hash = $s",
                                         {"s": first["state_hash"]}).to_pylist()
    assert [r["action"] for r in cached] == [first["action"]]  # later snapshots leave it out too


SEED_MODES = ("baseline_worker", "hierarchy_vac_macros", "qwen_worker_zero", "qwen_worker_bc", "qwen_worker_dpo",
              "qwen_pure_zero", "qwen_pure_grpo", "gpt4o_baseline", "qwen3vl_base", "qwen3vl_grpo", "qwen3vl_mcts")


def test_every_seed_mode_runs_offline_side_by_side(tmp_path, manager_server, monkeypatch):
    """One local server answers for every model the seed modes name (as vLLM's --served-model-name and --lora-modules)."""
    from click.testing import CliRunner
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from halo_agent.cli import main
    from halo_agent.rollout import load_modes

    modes = load_modes()
    engine = manager_server.engine
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(engine.model_path), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    lora.save_pretrained(tmp_path / "adapter")
    adapters = {modes[m].adapter for m in SEED_MODES if modes[m].adapter}
    models = {modes[m].model for m in SEED_MODES if not modes[m].adapter} | {"gpt-4o"}
    with ChatCompletionServer(LocalChatModel(engine.model_path, adapters={a: tmp_path / "adapter" for a in adapters}, device="cpu"),
                              served_model_name=sorted(models)) as server:
        monkeypatch.setenv("HALO_VLLM_URL", server.url)
        lake = tmp_path / "lake"
        result = CliRunner().invoke(main, ["eval", "--modes", ",".join(SEED_MODES), "--tasks", "click-dialog", "--max-steps", "2",
                                           "--lake", str(lake), "--run-id", "seeds", "--no-progress", "--policy-option", "max_tokens=8"])
        assert result.exit_code == 0, result.output
    l = Lake.open(lake)
    matrix = {r["mode"]: r for r in l.query_arrow("select * from eval_matrix").to_pylist()}
    assert set(matrix) == set(SEED_MODES) and all(r["n_episodes"] == 1 and r["error_rate"] == 0 for r in matrix.values())
    managed = {m for m in SEED_MODES if modes[m].manager}
    assert managed == {"hierarchy_vac_macros", "qwen_worker_zero", "qwen_worker_bc", "qwen_worker_dpo"}
    assert {m for m, r in matrix.items() if r["manager_call_rate"] > 0} == managed  # each consulted it at the start
    costs = l.query_arrow("select mode, model, role from episode_costs where role = 'manager'").to_pylist()
    assert {(c["mode"], c["model"]) for c in costs} == {(m, "gpt-4o") for m in managed}
