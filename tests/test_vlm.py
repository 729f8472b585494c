"""A tiny Qwen2-VL trained and served on CPU: screenshots from a real MiniWoB rollout, resolved from the lake by hash."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from halo_data import prompts
from halo_data.lake import Lake
from halo_train.cli import main

pytestmark = pytest.mark.slow

TASKS = ["click-button", "click-link"]
FAST = ["--batch-size", "2", "--lora-r", "4", "--lora-alpha", "8", "--logging-steps", "1"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A random-policy rollout with screenshots on (text prompts, screenshot hashes) and a tiny VLM built by the CLI."""
    from halo_agent.rollout import RolloutConfig, run_rollouts

    root = tmp_path_factory.mktemp("vlm")
    run_rollouts(RolloutConfig(env="miniwob", tasks=TASKS, rollouts_per_task=3, policy="random", max_steps=2,
                               lake=str(root / "lake"), run_id="random", progress=False))
    result = CliRunner().invoke(main, ["make-tiny-model", "--vision", str(root / "tiny-vlm")])
    assert result.exit_code == 0, result.output
    return {"root": root, "lake": str(root / "lake"), "model": str(root / "tiny-vlm")}


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def step_rows(lake: str, where: str = "true") -> list[dict]:
    return Lake.open(lake).query_arrow(
        f"select prompt, model_output as completion, screenshot_hash, goal, url, observation from steps where {where} "
        "order by episode_id, step_idx"
    ).to_pylist()


def test_tiny_vlm_folder_loads_as_a_qwen2_vl_checkpoint(world):
    from transformers import AutoModelForImageTextToText

    from halo_agent.vlm import is_vlm, load_processor

    assert is_vlm(world["model"])
    model = AutoModelForImageTextToText.from_pretrained(world["model"])
    processor = load_processor(world["model"])
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert type(processor).__name__ == "Qwen2VLProcessor"
    assert processor.image_processor.size["longest_edge"] == 28 * 28 * 48
    assert invoke("make-tiny-model", "--vision", "--warmup-lake", world["lake"], str(world["root"] / "x")).exit_code != 0


def test_a_text_steps_vlm_prompt_is_the_one_screenshot_mode_renders():
    text = prompts.render_messages("Click OK", "file:///t.html", "[1] button 'OK'", ["click('2')"])
    shown = prompts.render_messages("Click OK", "file:///t.html", "[1] button 'OK'", ["click('2')"],
                                    screenshot_hash="ab" * 32, use_screenshot=True)
    assert prompts.with_screenshot(text, "ab" * 32) == shown
    assert prompts.with_screenshot(shown, "cd" * 32) == shown  # a prompt's own image wins
    assert prompts.image_hashes(shown) == ["ab" * 32]


def test_training_and_serving_see_the_same_tokens(world):
    """The lake row through the trainer's encoder == the screenshot-mode request through the chat server's engine."""
    from halo_agent.policies.hf_policy import LocalChatModel
    from halo_agent.vlm import image_token_count
    from halo_train.vlm import ScreenshotStore, VLMBatchEncoder, prompt_lengths

    lake = Lake.open(world["lake"])
    row = step_rows(world["lake"], "screenshot_hash is not null")[0]
    assert not prompts.has_image(prompts.loads(row["prompt"]))  # a random policy's text prompt
    engine = LocalChatModel(world["model"], device="cpu")
    stats = {"images_decoded": 0, "image_tokens": 0, "pixel_patches": 0, "batches": 0}
    encoder = VLMBatchEncoder(engine.processor, ScreenshotStore(world["lake"], lake.versions()), stats)
    trained = encoder.encode_prompts([row])[0]

    # Serving: the prompt screenshot mode renders for the same step, images resolved to base64 as the openai policy sends them.
    served_messages = prompts.render_messages(row["goal"], row["url"], row["observation"], [],
                                              screenshot_hash=row["screenshot_hash"], use_screenshot=True)
    image = lake.query_arrow("select image from screenshots where hash = $h", {"h": row["screenshot_hash"]}).to_pylist()[0]["image"]
    request = prompts.resolve_images(served_messages, lambda h: (image, "png"))
    served_ids, n_images = engine.chat_prompt(request)

    history_free = prompts.loads(row["prompt"])[1]["content"].split("Previous actions:\n")[1].startswith("(none)")
    assert history_free  # the first row is a first step: no history to re-render
    assert trained.input_ids == served_ids and n_images == 1
    # --max-length's count (from the screenshot's size, nothing decoded) is the encoded length.
    assert prompt_lengths(engine.processor, encoder.store, [row]) == [len(trained.input_ids)]
    tokenizer = engine.tokenizer
    text = tokenizer.decode(served_ids)
    assert text.index("<|im_start|>user\n<|vision_start|><|image_pad|>") < text.index("Goal:")
    pads = image_token_count({"input_ids": torch.tensor(served_ids)}, engine.processor)
    assert pads == int(trained.image_grid_thw.prod()) // 4 > 0


def test_vlm_bc_on_miniwob_screenshots(world):
    from safetensors.torch import load_file

    out = world["root"] / "bc"
    result = invoke("bc", "--lake", world["lake"], "--base-model", world["model"], "--output-dir", str(out),
                    "--max-steps", "4", "--lr", "0.01", *FAST)
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "final" / "training_stats.json").read_text())
    losses = [h["loss"] for h in stats["log_history"] if "loss" in h]
    assert len(losses) == 4 and losses[-1] < losses[0]
    vlm = stats["vlm"]
    assert (vlm["lora_on"], vlm["vision_tower"], vlm["trainable_outside_language_model"]) == ("language_model", "frozen", [])
    assert vlm["rows_without_screenshot"] == 0 and vlm["batches"] >= 4 and vlm["image_tokens"] > 0
    weights = load_file(str(out / "final" / "adapter_model.safetensors"))
    assert weights and all("language_model" in k for k in weights)
    assert all(float(v.norm()) > 0 for k, v in weights.items() if "lora_B" in k)
    assert (out / "final" / "preprocessor_config.json").exists()  # the processor travels with the adapter


def test_an_update_moves_lora_and_leaves_the_vision_tower(world):
    from halo_train.config import BCConfig
    from halo_train.backends import load_vlm_for_training, vision_parameters
    from halo_train.vlm import BCCollator, ScreenshotStore, VLMBatchEncoder

    cfg = BCConfig(lake=world["lake"], base_model=world["model"], lora_r=4, lora_alpha=8)
    model, processor = load_vlm_for_training(cfg, world["model"], torch.float32)
    rows = step_rows(world["lake"], "screenshot_hash is not null")[:3]
    stats = {"images_decoded": 0, "image_tokens": 0, "pixel_patches": 0, "batches": 0}
    batch = BCCollator(VLMBatchEncoder(processor, ScreenshotStore(world["lake"], Lake.open(world["lake"]).versions()), stats))(rows)

    # The processor was fed one image per row: as many grids, and the patches and pad tokens they imply.
    grids = batch["image_grid_thw"]
    assert grids.shape[0] == len(rows)
    assert batch["pixel_values"].shape[0] == int(grids.prod(-1).sum())
    assert stats["image_tokens"] == int(grids.prod(-1).sum()) // 4
    assert stats["images_decoded"] == len({r["screenshot_hash"] for r in rows})

    vision_before = {n: p.detach().clone() for n, p in vision_parameters(model).items()}
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert vision_before and all(torch.equal(p, vision_before[n]) for n, p in vision_parameters(model).items())
    assert any(not torch.equal(p, lora_before[n]) for n, p in model.named_parameters() if "lora_" in n)


def test_a_missing_screenshot_stops_the_job_naming_its_hash(world, tmp_path):
    from deltalake import DeltaTable

    lake_copy = tmp_path / "lake"
    shutil.copytree(world["lake"], lake_copy)
    victim = step_rows(str(lake_copy), "screenshot_hash is not null")[0]["screenshot_hash"]
    DeltaTable(str(lake_copy / "screenshots")).delete(f"hash = '{victim}'")
    result = invoke("bc", "--lake", str(lake_copy), "--base-model", world["model"], "--output-dir", str(tmp_path / "o"),
                    "--max-steps", "1", *FAST)
    assert result.exit_code != 0
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and victim in errors[0] and "missing from the lake's screenshots table" in errors[0]
    assert not (tmp_path / "o" / "final").exists()


def test_max_length_counts_the_image_tokens(world, tmp_path):
    result = invoke("bc", "--lake", world["lake"], "--base-model", world["model"], "--output-dir", str(tmp_path / "o"),
                    "--max-length", "120", "--max-steps", "1", *FAST)
    assert result.exit_code != 0
    assert "no bc rows left to train on" in result.output and "raise --max-length" in result.output


def test_vlm_grpo_on_a_random_policys_groups(world):
    out = world["root"] / "grpo"
    result = invoke("grpo", "--lake", world["lake"], "--base-model", world["model"], "--output-dir", str(out),
                    "--max-steps", "1", *FAST)
    assert result.exit_code == 0, result.output
    stats = json.loads((out / "final" / "training_stats.json").read_text())
    assert stats["vlm"]["image_tokens"] > 0 and stats["vlm"]["vision_tower"] == "frozen"
    assert stats["metrics"]["advantage_abs_mean"] > 0


def test_vlm_dpo_then_the_adapter_served_by_the_chat_server(world, tmp_path):
    """A DPO step on the random policy's pairs; the adapter loads into the chat server serving the tiny VLM
    (vLLM's runtime LoRA API) and drives a screenshot-mode rollout, offline."""
    from halo_agent.chat_server import ChatCompletionServer
    from halo_agent.policies.hf_policy import LocalChatModel
    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_agent.serving import EngineClient

    result = invoke("dpo", "--lake", world["lake"], "--base-model", world["model"], "--output-dir", str(tmp_path / "dpo"),
                    "--max-steps", "1", "--lr", "0.01", *FAST)
    assert result.exit_code == 0, result.output
    adapter = tmp_path / "dpo" / "final"
    stats = json.loads((adapter / "training_stats.json").read_text())
    assert {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"} <= set(stats["metrics"])
    assert stats["vlm"]["image_tokens"] > 0 and stats["rows"] >= 1

    lake = str(tmp_path / "lake")
    with ChatCompletionServer(LocalChatModel(world["model"], device="cpu"), served_model_name="tiny-vlm") as server:
        EngineClient(server.url).load_adapter("vlm-dpo", str(adapter))
        run_rollouts(RolloutConfig(env="miniwob", tasks=["click-button"], rollouts_per_task=1, policy="openai",
                                   model="tiny-vlm", adapter="vlm-dpo", max_steps=2, lake=lake, run_id="served",
                                   policy_options={"base_url": server.url, "use_screenshot": True, "max_tokens": 8},
                                   progress=False))
        received = list(server.received)
    assert received and all(r["model"] == "vlm-dpo" and r["images"] == 1 and r["image_bytes"] > 0 for r in received)
    rows = step_rows(lake)
    assert len(rows) == len(received)
    assert all(prompts.image_hashes(prompts.loads(r["prompt"])) == [r["screenshot_hash"]] for r in rows)


def test_a_guided_choice_with_an_image_is_refused_not_scored_without_it(world):
    """The chat server's choice scoring sees text only: a VLM request with an image and choices is a 400, not a blind pick."""
    import base64
    import io

    import openai
    from PIL import Image

    from halo_agent.chat_server import ChatCompletionServer
    from halo_agent.policies.hf_policy import LocalChatModel

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), "white").save(buf, format="PNG")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "Click OK."}]}]
    with ChatCompletionServer(LocalChatModel(world["model"], device="cpu"), served_model_name="tiny-vlm") as server:
        client = openai.OpenAI(base_url=server.url, api_key="none")
        with pytest.raises(openai.BadRequestError, match="guided choice with image inputs is not supported"):
            client.chat.completions.create(model="tiny-vlm", messages=messages, max_tokens=4,
                                           extra_body={"structured_outputs": {"choice": ["click('1')", "click('2')"]}})
        answered = client.chat.completions.create(model="tiny-vlm", messages=messages, max_tokens=4)
    assert len(answered.choices) == 1


def test_an_online_grpo_iteration_with_the_tiny_vlm_served_by_the_chat_server(world, tmp_path):
    from halo_train.online import OnlineConfig, run_online

    from halo_train.testing import chat_server_in_process

    with chat_server_in_process(world["model"]) as url:
        cfg = OnlineConfig(base_model=world["model"], tasks=["click-button"], iterations=1, group_size=3, max_episode_steps=2,
                           train_steps=1, lr=0.01, max_tokens=8, batch_size=2, lora_r=4, engine_url=url,
                           lake=str(tmp_path / "lake"), output_dir=str(tmp_path / "out"), run_id="online-vlm", progress=False)
        lines: list[str] = []
        summary = run_online(cfg, echo=lines.append)
    assert len(summary.iterations) == 1 and lines[0].startswith("iteration 0")
    rows = step_rows(cfg.lake)
    # Sampled in screenshot mode by the served VLM: every prompt carries its step's screenshot.
    assert len(rows) >= 3 and all(prompts.image_hashes(prompts.loads(r["prompt"])) == [r["screenshot_hash"]] for r in rows)
    run = Lake.open(cfg.lake).query_arrow("select status, config from runs where run_id = 'online-vlm'").to_pylist()[0]
    assert run["status"] == "finished"
    iteration = json.loads(run["config"])["iterations"][0]
    if iteration.get("adapter"):  # the group had a reward spread: an update was trained on the images
        stats = json.loads((Path(iteration["adapter"]) / "training_stats.json").read_text())
        assert stats["vlm"]["image_tokens"] > 0 and summary.served == "online-vlm-policy-1"
    else:  # the tiny VLM's untrained answers all fail alike: recorded, no update, the base model still served
        assert iteration["update"] == "skipped: every group has zero reward spread" and summary.served is None


def test_a_qwen3_vl_click_on_the_grid_lands_on_the_button_in_chromium():
    """Computer-use JSON on 0..1000 -> validated, rescaled to the viewport's pixels (what the step stores as its
    action, beside the raw output), executed by the real MiniWoB page."""
    from halo_agent.envs.miniwob import VIEWPORT, MiniWoBEnv
    from halo_agent.policies.openai_policy import OpenAIPolicy
    from halo_agent.rollout.episode import build_observation

    env = MiniWoBEnv()
    try:
        page = env.reset(MiniWoBEnv.task_spec("click-test"), 0)
        obs = build_observation(page, "miniwob.click-test", [], 0, True, "ab" * 32)
        (x, y, width, height), = page.extra["element_bboxes"].values()
        centre = (x + width / 2, y + height / 2)
        grid = [round(centre[0] * 1000 / VIEWPORT["width"]), round(centre[1] * 1000 / VIEWPORT["height"])]
        raw = json.dumps({"name": "computer_use", "arguments": {"action": "left_click", "coordinate": grid}})
        policy = OpenAIPolicy(model="qwen3-vl", base_url="http://127.0.0.1:9/v1", use_screenshot=True, coordinate_scale=1000)
        action, error = policy.parse(raw, obs, policy._viewport(obs))
        assert error is None
        assert action == f"mouse_click({round(grid[0] * VIEWPORT['width'] / 1000)}, {round(grid[1] * VIEWPORT['height'] / 1000)})"
        outcome = env.step(action)
        assert outcome.action_error is None and outcome.reward > 0 and outcome.terminated
    finally:
        env.close()


class ComputerUseEndpoint:
    """Stands in for a served Qwen3-VL (which cannot run here): an OpenAI-compatible chat endpoint that answers every
    request, image included, with one computer-use tool call on the 0..1000 grid."""

    def __init__(self, grid: list[int]):
        import http.server

        from halo_agent.local_http import LocalHTTPServer, reply

        answer = json.dumps({"name": "computer_use", "arguments": {"action": "left_click", "coordinate": grid}})
        endpoint = self
        self.images: list[int] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                parts = [p for m in body["messages"] if isinstance(m["content"], list) for p in m["content"]]
                endpoint.images.append(sum(p["type"] == "image_url" for p in parts))
                payload = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                reply(self, 200, json.dumps(payload).encode(), "application/json")

            def log_message(self, *args):
                pass

        self.server = LocalHTTPServer(Handler)

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop()


def test_a_coordinate_rollout_stores_the_raw_output_and_the_pixels_it_clicked(tmp_path):
    from dashboards import annotate
    from halo_agent.envs.miniwob import VIEWPORT, MiniWoBEnv
    from halo_agent.rollout import RolloutConfig, run_rollouts

    env = MiniWoBEnv()
    try:
        (x, y, width, height), = env.reset(MiniWoBEnv.task_spec("click-test"), 0).extra["element_bboxes"].values()
    finally:
        env.close()
    grid = [round((x + width / 2) * 1000 / VIEWPORT["width"]), round((y + height / 2) * 1000 / VIEWPORT["height"])]
    pixels = (round(grid[0] * VIEWPORT["width"] / 1000), round(grid[1] * VIEWPORT["height"] / 1000))
    lake = str(tmp_path / "lake")
    with ComputerUseEndpoint(grid) as endpoint:
        run_rollouts(RolloutConfig(env="miniwob", tasks=["click-test"], rollouts_per_task=1, task_seed=0, policy="openai",
                                   model="qwen3-vl", max_steps=2, lake=lake, run_id="coords", progress=False,
                                   policy_options={"base_url": endpoint.server.url, "use_screenshot": True,
                                                   "coordinate_scale": 1000, "logprobs": False}))
    assert endpoint.images == [1]
    step, = Lake.open(lake).query_arrow("select model_output, action, action_valid, success from steps").to_pylist()
    assert json.loads(step["model_output"])["arguments"]["coordinate"] == grid  # the raw output, as answered
    assert step["action"] == f"mouse_click({pixels[0]}, {pixels[1]})"  # the viewport pixels executed
    assert step["action_valid"] and step["success"]
    mark = annotate.action_mark(step["action"])  # what the replay draws on the screenshot
    assert mark.kind == "point" and mark.points == ((float(pixels[0]), float(pixels[1])),)
