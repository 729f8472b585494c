"""The one real pretrained model, SmolLM2-135M-Instruct, used by name: served by HALO's chat server, trained with LoRA.

Everything else in the suite runs on tiny models; these few tests load the real one (converted into the model cache
by .ci/setup) to show that the name resolves wherever a model folder is taken, and that the model answers a page.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from halo_agent.chat_server import ChatCompletionServer  # noqa: E402
from halo_agent.policies.hf_policy import LocalChatModel  # noqa: E402
from halo_agent.policies.openai_policy import OpenAIPolicy  # noqa: E402
from halo_agent.types import Element, Observation  # noqa: E402
from halo_data.prompts import render_messages  # noqa: E402

pytestmark = pytest.mark.slow

NAME = "smollm2-135m-instruct"
ELEMENTS = (Element("4", "button", "Cancel", "click"), Element("5", "button", "Submit", "click"),
            Element("6", "link", "Help", "click"))
GOAL = 'Click on the "Submit" button.'
WAIT_S = 600.0  # the policy waits for a loaded CPU's answer: a retry would only queue behind the first request


@pytest.fixture(scope="module")
def server():
    with ChatCompletionServer(LocalChatModel(NAME, device="cpu")) as s:
        yield s


def click_button_page() -> Observation:
    page = "\n".join(f"[{e.bid}] {e.role} '{e.name}'" for e in ELEMENTS)
    url = "file:///miniwob/click-button.html"
    return Observation(goal=GOAL, url=url, axtree=page, elements=ELEMENTS, screenshot=None, screenshot_hash=None,
                       messages=render_messages(GOAL, url, page, goal_last=True), history=(), step_idx=0,
                       task_id="miniwob.click-button", extra={})


def test_the_chat_server_serves_the_model_by_name_and_answers_a_page_within_its_actions(server, monkeypatch):
    for var in ("HALO_VLLM_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    assert server.served_model_name == NAME  # the converted folder is named after the model
    policy = OpenAIPolicy(model=NAME, base_url=server.url, temperature=0.0, constrain_actions=True, max_retries=0,
                          timeout_s=WAIT_S)
    out = policy.act(click_button_page())
    assert (out.action, out.parse_error, out.api_error) == ("click('5')", None, None)
    assert len(out.logprobs) == out.completion_tokens > 0


def test_a_lora_step_on_the_model_by_name_changes_its_adapter_weights(tmp_path):
    from halo_train.backends import load_for_training
    from halo_train.config import BCConfig
    from halo_agent.models import resolve_model

    cfg = BCConfig(lake=str(tmp_path / "lake"), base_model=NAME, target_modules="q_proj,v_proj", lora_r=8, lora_dropout=0.0)
    assert cfg.base_model == resolve_model(NAME)
    loaded = load_for_training(cfg)
    model, tokenizer = loaded.model, loaded.tokenizer
    messages = click_button_page().messages[1:]  # a short sequence: the page without the system prompt
    text = tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": "click('5')"}], tokenize=False)
    batch = tokenizer([text], return_tensors="pt")
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model.train()
    loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, trainable[n])]
    assert len(changed) == len(trainable)


def test_a_rollout_with_the_model_by_name_lands_token_exact_steps(server, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from halo_agent.models import resolve_model
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_data.lake import Lake
    from halo_train.grpo import pad_members, tokenize_member
    from halo_train.grpo_loss import behaviour_token_logps

    lake = str(tmp_path / "lake")
    run_rollouts(RolloutConfig(
        env="miniwob", tasks=["click-button"], policy="openai", model=NAME, temperature=1.0,
        policy_options={"base_url": server.url, "constrain_actions": True, "max_retries": 0, "timeout_s": WAIT_S},
        observation="elements", max_steps=2, seed=0, task_seed=200000, lake=lake, run_id="smollm2", progress=False,
    ))
    steps = Lake.open(lake).query_arrow(
        "select prompt, model_output, completion_token_ids, logprobs, logprobs_mode, draw, choices, temperature "
        "from steps order by step_idx").to_pylist()
    assert 1 <= len(steps) <= 2
    for s in steps:
        assert len(s["completion_token_ids"]) == len(s["logprobs"]) > 0
        assert (s["logprobs_mode"], s["draw"]) == ("processed_logprobs", "masked_choice") and s["model_output"] in s["choices"]
    # The trainer scores the stored tokens under the masked draw: before any update every ratio is 1.
    model, tokenizer = AutoModelForCausalLM.from_pretrained(resolve_model(NAME)).eval(), AutoTokenizer.from_pretrained(resolve_model(NAME))
    batch = pad_members([tokenize_member(tokenizer, s["prompt"], s["model_output"], 256, s) for s in steps], tokenizer.pad_token_id)
    with torch.no_grad():
        token_logps, mask = behaviour_token_logps(model, batch)
    ratios = torch.exp(token_logps - batch["token_logprobs"])[mask.bool()]
    assert float((ratios - 1).abs().max()) < 1e-4
