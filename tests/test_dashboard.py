"""The Streamlit dashboard, page by page, through streamlit.testing's AppTest over real lakes."""

from __future__ import annotations

import datetime as dt
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image, ImageDraw
from streamlit.testing.v1 import AppTest

import dashboards
from dashboards import annotate
from halo_agent import local_http
from halo_data.config import RewardWeights
from halo_data.lake import Lake
from halo_data.query import QueryError, check_read_only
from halo_data.writer import EpisodeWriter, Screenshot, append_rows

APP = Path(dashboards.__file__).parent / "app.py"
T0 = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
WEIGHTS = RewardWeights()


def make_png(seed: int, size: tuple[int, int] = (320, 200)) -> bytes:
    img = Image.new("RGB", size, (240, 240 - seed * 7 % 100, 230))
    pen = ImageDraw.Draw(img)
    pen.rectangle([20 + seed % 50, 30, 140, 70], fill=(40, 90, 200))
    pen.text((30, 40), f"page {seed}", fill=(255, 255, 255))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# Each run: (run_id, mode, policy_version, {task: [outcome of each attempt]}); an outcome is
# "ok" (success), "fail" or "error" (an episode-level error). Three attempts share one task_seed.
FIXTURE_RUNS = (
    ("eval-base", "base", "v0", {"miniwob.click-button": ["fail", "fail", "fail"], "miniwob.enter-text": ["fail", "fail", "error"]}),
    ("eval-tuned", "tuned", "v1", {"miniwob.click-button": ["ok", "fail", "ok"], "miniwob.enter-text": ["fail", "fail", "fail"]}),
)
STEPS_PER_EPISODE = 3


def _steps(run_id: str, task: str, attempt: int, outcome: str, shots: list[Screenshot]) -> list[dict]:
    steps = []
    for i in range(STEPS_PER_EPISODE):
        last = i == STEPS_PER_EPISODE - 1
        if i == 0:
            action, extra = "mouse_click(120, 48)", None
        elif i == 1:
            action, extra = "click('12')", json.dumps({"element_bboxes": {"12": [30, 100, 80, 24]}})
        else:
            action, extra = "fill('7', 'hello')", None
        parse_error = (
            "could not parse 'clik(12)'"
            if (run_id == "eval-tuned" and task == "miniwob.click-button" and attempt == 1 and i == 1)
            else None
        )
        prompt = [
            {"role": "system", "content": "You are a web agent."},
            {"role": "user", "content": [{"type": "image_ref", "hash": shots[i].hash}, {"type": "text", "text": f"Goal: {task} step {i}"}]},
        ]
        steps.append(
            {
                "step_idx": i,
                "url": f"http://localhost/{task}/{i}",
                "goal": f"do {task}",
                "observation": f"[12] button 'Submit' step {i}\n[7] textbox 'Name'",
                "screenshot_hash": shots[i].hash,
                "screenshot_after_hash": shots[i + 1].hash,
                "prompt": json.dumps(prompt),
                "prompt_version": "halo-prompt-v1",
                "model_output": action if parse_error is None else "clik(12)",
                "action": action if parse_error is None else None,
                "action_source": "model",
                "action_valid": parse_error is None,
                "parse_error": parse_error,
                "r_progress": 0.1,
                "r_novelty": 1.0 if i == 0 else 0.0,
                "r_loop": 0.0,
                "r_validity": 0.0 if parse_error is None else -1.0,
                "r_success": 1.0 if (last and outcome == "ok") else 0.0,
                "cumulative_progress": 0.1 * (i + 1),
                "state_hash": f"state-{task}-{i}",
                "extra": extra,
            }
        )
    return steps


def build_fixture_lake(root: Path) -> Lake:
    """Two eval runs (2 tasks x 3 attempts, 3 steps each), screenshots, a training run with metrics and lineage."""
    lake = Lake.init(str(root))
    shots = [Screenshot.from_bytes(make_png(k)) for k in range(STEPS_PER_EPISODE + 1)]
    with EpisodeWriter(lake, flush_episodes=100) as writer:
        for r, (run_id, mode, version, tasks) in enumerate(FIXTURE_RUNS):
            for t, (task, outcomes) in enumerate(tasks.items()):
                for attempt, outcome in enumerate(outcomes):
                    started = T0 + dt.timedelta(hours=r, minutes=t * 10 + attempt)
                    episode = {
                        "run_id": run_id, "env": "miniwob", "task_id": task, "site": "miniwob", "mode": mode,
                        "policy": "openai", "model": "qwen-tiny", "policy_version": version, "attempt_idx": attempt,
                        "task_seed": 3, "temperature": 0.7, "success": outcome == "ok",
                        "task_reward": 1.0 if outcome == "ok" else 0.0, "terminated": outcome == "ok",
                        "truncated": outcome == "fail",
                        "error": "browser crashed: target closed\n  at page.goto" if outcome == "error" else None,
                        "started_at": started, "ended_at": started + dt.timedelta(seconds=30),
                    }
                    writer.write_episode(episode, _steps(run_id, task, attempt, outcome, shots), shots)
    steps_version = lake.table("steps").version()
    lake.upsert_runs(
        [{"run_id": run_id, "kind": "eval", "mode": mode, "env": "miniwob", "model": "qwen-tiny", "policy_version": v,
          "status": "finished", "started_at": T0} for run_id, mode, v, _ in FIXTURE_RUNS]
        + [{"run_id": "train-grpo", "kind": "train", "mode": "grpo", "job_type": "grpo", "base_model": "qwen-tiny",
            "source_view": "grpo_groups", "lineage": json.dumps({"steps": steps_version, "runs": 0}),
            "output_dir": "out/grpo", "status": "finished", "started_at": T0 + dt.timedelta(days=1)}]
    )
    append_rows(
        lake, "train_metrics",
        [{"run_id": "train-grpo", "step": s, "metric": m, "value": v, "logged_at": T0}
         for s in range(10)
         for m, v in (("loss", 1.0 / (s + 1)), ("frac_reward_zero_std", 0.5), ("learning_rate", 1e-5))],
    )
    return lake


def expected_episodes() -> list[dict]:
    """The fixture's episodes with their shaped return, computed from the components and weights."""
    out = []
    for run_id, mode, version, tasks in FIXTURE_RUNS:
        for task, outcomes in tasks.items():
            for attempt, outcome in enumerate(outcomes):
                shaped = sum(
                    WEIGHTS.shaped({k: s[f"r_{k}"] for k in ("progress", "novelty", "loop", "validity", "success")})
                    for s in _steps(run_id, task, attempt, outcome, [Screenshot.from_bytes(make_png(k)) for k in range(4)])
                )
                out.append({"run_id": run_id, "mode": mode, "task_id": task, "policy_version": version, "outcome": outcome, "shaped": shaped})
    return out


@pytest.fixture(scope="module")
def fixture_lake(tmp_path_factory) -> Lake:
    return build_fixture_lake(tmp_path_factory.mktemp("dashboard") / "lake")


def open_app(monkeypatch, root, page: str | None = None) -> AppTest:
    monkeypatch.setenv("HALO_LAKE", str(root))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    if page:
        at.switch_page(f"app_pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """All the text a person reads on the page (markdown, captions, code, alerts, metrics)."""
    parts = []
    for kind in ("markdown", "caption", "code", "error", "warning", "info", "success", "title", "subheader"):
        parts += [str(e.value) for e in at.get(kind)]
    parts += [f"{m.label} {m.value}" for m in at.metric]
    return "\n".join(parts)


ALL_PAGES = ("overview", "rewards", "grpo", "replay", "training", "errors", "compare", "experiments", "sql")


# ---------------------------------------------------------------------------------- empty / missing


def test_missing_lake_says_so(monkeypatch, tmp_path):
    at = open_app(monkeypatch, tmp_path / "nowhere")
    assert f"no HALO lake at {tmp_path / 'nowhere'}" in at.error[0].value


@pytest.mark.parametrize("page", ALL_PAGES)
def test_empty_lake_every_page_explains(monkeypatch, tmp_path, page):
    Lake.init(str(tmp_path / "lake"))
    at = open_app(monkeypatch, tmp_path / "lake", page)
    text = texts(at)
    if page == "training":
        assert "No training runs" in text
    elif page == "sql":
        assert at.text_area(key="sql_text").value
    else:
        assert "has no episodes yet" in text


# ---------------------------------------------------------------------------------- pages


def test_overview_counts_runs_and_eval_matrix(monkeypatch, fixture_lake):
    at = open_app(monkeypatch, fixture_lake.root)
    metrics = {m.label: m.value for m in at.metric}
    n_episodes = len(expected_episodes())
    assert metrics == {"Runs with episodes": "2", "Episodes": str(n_episodes), "Steps": str(n_episodes * STEPS_PER_EPISODE)}
    runs = at.dataframe[0].value.set_index("run_id")
    assert set(runs.index) == {"eval-base", "eval-tuned", "train-grpo"}
    assert runs.loc["eval-tuned", "success_rate"] == pytest.approx(2 / 6)
    tuned = [e["shaped"] for e in expected_episodes() if e["run_id"] == "eval-tuned"]
    assert runs.loc["eval-tuned", "mean_shaped_return"] == pytest.approx(sum(tuned) / len(tuned))
    assert runs.loc["train-grpo", "episodes"] == 0
    matrix = at.dataframe[1].value.set_index("mode")
    assert matrix.loc["base", "success_rate"] == 0 and matrix.loc["tuned", "n_episodes"] == 6
    assert len(at.get("vega_lite_chart")) == 2


def test_rewards_per_run_components_sum_to_shaped_return(monkeypatch, fixture_lake):
    at = open_app(monkeypatch, fixture_lake.root, "rewards")
    per_run = at.dataframe[0].value.set_index("run_id")
    components = per_run[["progress", "novelty", "loop", "validity", "success"]].sum(axis=1)
    assert components.to_dict() == pytest.approx(per_run.mean_shaped_return.to_dict())
    assert per_run.loc["eval-tuned", "mean_task_reward"] == pytest.approx(2 / 6)
    assert len(at.get("vega_lite_chart")) == 4
    # Filters narrow every chart and table to the chosen episodes.
    at.multiselect(key="rewards_runs").set_value(["eval-base"]).run()
    assert list(at.dataframe[0].value.run_id) == ["eval-base"]


def test_grpo_health_fractions_and_stall_warning(monkeypatch, fixture_lake):
    at = open_app(monkeypatch, fixture_lake.root, "grpo")
    groups: dict[tuple, list[float]] = {}
    for e in expected_episodes():
        if e["outcome"] != "error":
            groups.setdefault((e["task_id"], e["policy_version"]), []).append(e["shaped"])
    zero = [max(g) - min(g) <= 1e-9 for g in groups.values()]
    frac = sum(zero) / len(zero)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["frac_reward_zero_std (all groups)"] == f"{frac:.1%}"
    assert metrics["Groups"] == str(len(groups))
    assert metrics["Trainable groups (reward std > 0)"] == str(len(zero) - sum(zero))
    assert frac > 0.5 and "learning stalls" in at.warning[0].value
    by_run = at.dataframe[0].value.set_index("run_id")
    assert by_run.loc["eval-base", "frac_reward_zero_std"] == 1.0
    assert by_run.loc["eval-tuned", "frac_reward_zero_std"] == 0.5
    at.checkbox(key="grpo_step_groups").check().run()
    assert "Anchor-state groups (2+ members)" in {m.label for m in at.metric}


def test_grpo_health_reads_per_state_groups_where_a_run_sampled_candidates(monkeypatch, tmp_path):
    """One attempt per task seed (--group-by state --group-size 1): the episode groups are zero-std by construction,
    so no stall warning from them; the page reads the candidates' per-state groups instead."""
    from halo_data import ids

    lake = Lake.init(str(tmp_path / "lake"))
    shots = [Screenshot.from_bytes(make_png(k)) for k in range(STEPS_PER_EPISODE + 1)]
    task = "miniwob.click-button"
    with EpisodeWriter(lake, flush_episodes=100) as writer:
        for version in ("0", "1"):
            for seed in (1, 2):
                episode = {"run_id": f"online-k{version}", "env": "miniwob", "task_id": task, "policy_version": version,
                           "attempt_idx": 0, "task_seed": seed, "success": seed == 1, "started_at": T0}
                writer.write_episode(episode, _steps("online", task, 0, "ok" if seed == 1 else "fail", shots), shots)
    # version 0: a state whose candidates differ (trainable), one whose candidates tie (flat), one that did not
    # reproduce; version 1: two flat states (frac 1.0).
    states = [("0", "a", (1.0, 0.0), "env"), ("0", "b", (0.0, 0.0), "env"), ("0", "c", (None, None), "unreproducible"),
              ("1", "d", (1.0, 1.0), "env"), ("1", "e", (0.0, 0.0), "env")]
    append_rows(lake, "candidates", [
        dict(run_id=f"online-k{v}", env="miniwob", episode_id=ids.episode_id(f"online-k{v}", task, 1, 0), task_id=task,
             step_idx=0, state_hash=h, candidate_idx=i, prompt="[]", prompt_hash=h, model_output=f"click('{i}')",
             action=f"click('{i}')", score=score, score_source=source, policy_version=v)
        for v, h, scores, source in states for i, score in enumerate(scores)
    ])
    at = open_app(monkeypatch, lake.root, "grpo")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Groups of one attempt"] == metrics["Groups"] == "4"
    assert (metrics["State groups"], metrics["Trainable state groups"], metrics["Unreproducible states"]) == ("4", "1", "1")
    assert metrics["frac_reward_zero_std (state groups)"] == "75.0%"
    assert not any("learning stalls" in w.value for w in at.warning)
    assert [w.value[:4] for w in at.warning] == ["75% "] and "per-state groups" in at.info[0].value
    per_version = {r["policy_version"]: r for r in at.dataframe[2].value.to_dict("records")}
    assert (per_version["0"]["n_state_groups"], per_version["0"]["n_trainable_state_groups"],
            per_version["0"]["frac_reward_zero_std"], per_version["0"]["n_unreproducible_states"]) == (2, 1, 0.5, 1)
    assert (per_version["1"]["n_state_groups"], per_version["1"]["frac_reward_zero_std"]) == (2, 1.0)


def _choose_episode(at: AppTest, run: str, task: str, attempt: int) -> AppTest:
    at.selectbox(key="replay_run").select(run).run()
    at.selectbox(key="replay_task").select(task).run()
    episode = at.selectbox(key="replay_episode")
    target = [o for o in episode.options if o.startswith(f"attempt {attempt} ")]
    assert target, episode.options
    return episode.select_index(episode.options.index(target[0])).run()


def test_replay_slider_and_prev_next(monkeypatch, fixture_lake):
    at = open_app(monkeypatch, fixture_lake.root, "replay")
    _choose_episode(at, "eval-tuned", "miniwob.click-button", 0)
    assert at.slider(key="replay_step").value == 0
    assert "mouse_click(120, 48)" in [c.value for c in at.code]
    assert "action drawn at (120, 48)" in texts(at)
    assert len(at.get("image")) == 3  # the step, and the before/after pair
    at.slider(key="replay_step").set_value(1).run()
    assert "click('12')" in [c.value for c in at.code]
    assert "action drawn at element 12 at (30, 100), 80×24" in texts(at)
    at.button(key="replay_next").click().run()
    assert at.slider(key="replay_step").value == 2
    assert "fill('7', 'hello')" in [c.value for c in at.code]
    assert "no coordinates or element box stored for this action" in texts(at)
    assert at.button(key="replay_next").disabled
    at.button(key="replay_prev").click().run()
    at.button(key="replay_prev").click().run()
    assert at.slider(key="replay_step").value == 0 and at.button(key="replay_prev").disabled
    assert at.query_params["step"] == "0"
    # A new episode starts at its first step.
    at.slider(key="replay_step").set_value(2).run()
    _choose_episode(at, "eval-tuned", "miniwob.click-button", 1)
    assert at.slider(key="replay_step").value == 0


def test_replay_shows_parse_error_and_deep_link(monkeypatch, fixture_lake):
    from halo_data import ids

    monkeypatch.setenv("HALO_LAKE", fixture_lake.root)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    episode = ids.episode_id("eval-tuned", "miniwob.click-button", 3, 1)
    at.query_params.update({"run": "eval-tuned", "episode": episode, "step": "1"})
    at.switch_page("app_pages/replay.py").run()
    assert not at.exception
    assert at.selectbox(key="replay_episode").value == episode
    assert at.slider(key="replay_step").value == 1
    assert "parse error: could not parse 'clik(12)'" in texts(at)
    assert "clik(12)" in [c.value for c in at.code]


class _ChatServer(ThreadingHTTPServer):
    requests: list[dict]


class _ChatHandler(BaseHTTPRequestHandler):
    """Speaks the OpenAI chat-completions protocol: answers with how many images and messages it got."""

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        images = sum(1 for m in body["messages"] if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url")
        reply = {
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"click('99') # {len(body['messages'])} messages, {images} images"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        local_http.reply(self, 200, json.dumps(reply).encode(), "application/json")

    def log_message(self, *args):
        pass


def test_replay_reask_with_edited_prompt(monkeypatch, fixture_lake):
    server = _ChatServer(("127.0.0.1", 0), _ChatHandler)
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HALO_VLLM_URL", f"http://127.0.0.1:{server.server_port}/v1")
        monkeypatch.setenv("HALO_VLLM_API_KEY", "sk-secret-never-shown")
        at = open_app(monkeypatch, fixture_lake.root, "replay")
        _choose_episode(at, "eval-tuned", "miniwob.click-button", 0)
        key = at.session_state["replay_episode"] + "_0"
        prompt = json.loads(at.text_area(key=f"reask_prompt_{key}").value)
        prompt.append({"role": "user", "content": "Try the Submit button."})
        at.text_area(key=f"reask_prompt_{key}").set_value(json.dumps(prompt)).run()
        at.button(key=f"reask_button_{key}").click().run()
        assert not at.exception
        code = [c.value for c in at.code]
        assert "click('99') # 3 messages, 1 images" in code and "mouse_click(120, 48)" in code
        sent = server.requests[-1]
        assert sent["path"] == "/v1/chat/completions" and sent["body"]["model"] == "qwen-tiny"
        assert sent["body"]["messages"][-1]["content"] == "Try the Submit button."
        image = sent["body"]["messages"][1]["content"][0]["image_url"]["url"]
        assert image.startswith("data:image/png;base64,")
        assert sent["auth"] == "Bearer sk-secret-never-shown"
        assert "sk-secret" not in texts(at) + "".join(str(w.value) for w in at.text_input)
        # A prompt that is not JSON is refused in one line, nothing is sent.
        n = len(server.requests)
        at.text_area(key=f"reask_prompt_{key}").set_value("not json").run()
        at.button(key=f"reask_button_{key}").click().run()
        assert "the prompt is not valid JSON" in texts(at) and len(server.requests) == n
    finally:
        server.shutdown()


def test_training_curves_and_lineage(monkeypatch, fixture_lake):
    at = open_app(monkeypatch, fixture_lake.root, "training")
    assert at.multiselect(key="training_runs").value == ["train-grpo"]
    assert at.multiselect(key="training_metrics").value == ["loss", "frac_reward_zero_std", "learning_rate"]
    assert len(at.get("vega_lite_chart")) == 3
    steps_version = fixture_lake.table("steps").version()
    assert f"`steps` v{steps_version}" in texts(at)
    lineage_runs = at.dataframe[-1].value
    assert set(lineage_runs.run_id) == {"eval-base", "eval-tuned"} and set(lineage_runs.episodes) == {6}


def test_errors_grouped_with_links_into_replay(monkeypatch, fixture_lake):
    at = open_app(monkeypatch, fixture_lake.root, "errors")
    groups = at.dataframe[0].value.set_index("kind")
    assert groups.loc["episode error", "message"] == "browser crashed: target closed"
    assert groups.loc["episode error", "episodes"] == 1
    assert groups.loc["parse error", "message"] == "could not parse 'clik(12)'"
    assert groups.loc["parse error", "episodes"] == 1
    links = at.get("page_link")
    assert len(links) == 2
    assert all("replay" in link.proto.page for link in links)
    assert any("eval-base · miniwob.enter-text" in link.proto.label for link in links)


def test_compare_runs_per_task(monkeypatch, fixture_lake):
    at = open_app(monkeypatch, fixture_lake.root, "compare")
    at.selectbox(key="compare_a_run").select("eval-base").run()
    at.selectbox(key="compare_b_run").select("eval-tuned").run()
    per_task = at.dataframe[0].value.set_index("task_id")
    assert per_task.loc["miniwob.click-button", "success_diff"] == pytest.approx(2 / 3)
    assert per_task.loc["miniwob.enter-text", "success_diff"] == 0
    assert {m.label: m.value for m in at.metric}["Common tasks"] == "2"
    at.radio(key="compare_dimension").set_value("mode").run()
    assert not at.exception and at.selectbox(key="compare_a_mode").value == "base"


def test_sql_box_runs_reads_and_refuses_writes(monkeypatch, fixture_lake):
    at = open_app(monkeypatch, fixture_lake.root, "sql")
    at.text_area(key="sql_text").set_value("select run_id, count(*) as n from episodes group by 1 order by 1").run()
    at.button(key="sql_run").click().run()
    result = at.dataframe[0].value
    assert list(result.run_id) == ["eval-base", "eval-tuned"] and list(result.n) == [6, 6]
    at.text_area(key="sql_text").set_value("delete from steps").run()
    at.button(key="sql_run").click().run()
    with pytest.raises(QueryError) as refused:
        check_read_only("delete from steps")
    assert at.error[0].value == str(refused.value)
    assert len(at.dataframe) == 0


def test_new_files_show_after_refresh(monkeypatch, tmp_path):
    lake = build_fixture_lake(tmp_path / "lake")
    at = open_app(monkeypatch, lake.root)
    before = {m.label: m.value for m in at.metric}["Episodes"]
    shots = [Screenshot.from_bytes(make_png(k)) for k in range(4)]
    with EpisodeWriter(lake) as writer:
        writer.write_episode(
            {"run_id": "eval-late", "env": "miniwob", "task_id": "miniwob.click-button", "site": "miniwob", "mode": "late"},
            _steps("eval-late", "miniwob.click-button", 0, "ok", shots), shots,
        )
    at.sidebar.button[0].click().run()
    assert int({m.label: m.value for m in at.metric}["Episodes"]) == int(before) + 1


# ---------------------------------------------------------------------------------- drawing


@pytest.mark.parametrize(
    "action, extra, described",
    [
        ("mouse_click(120, 48)", None, "(120, 48)"),
        ("mouse_dblclick(5.5, 7)", None, "(6, 7)"),
        ("mouse_drag_and_drop(10, 20, 200, 40)", None, "(10, 20) → (200, 40)"),
        ("click('12')", {"action_bbox": [1, 2, 30, 40]}, "element 12 at (1, 2), 30×40"),
        ("click('12')", json.dumps({"element_bbox": {"x": 3, "y": 4, "width": 5, "height": 6}}), "element 12 at (3, 4), 5×6"),
        ("fill('a7', 'x')", {"extra_element_properties": {"a7": {"bbox": [10, 10, 50, 20], "visibility": 1}}}, "element a7 at (10, 10), 50×20"),
        ("click('12')", {"element_bboxes": {"13": [0, 0, 1, 1]}}, None),
        ("click('12')", "not json", None),
        ("noop()", None, None),
        (None, None, None),
    ],
)
def test_action_mark(action, extra, described):
    mark = annotate.action_mark(action, extra)
    assert (mark.describe() if mark else None) == described


def test_draw_action_marks_the_point_and_box():
    png = make_png(1)
    plain = annotate.draw_action(png, None)
    clicked = annotate.draw_action(png, annotate.action_mark("mouse_click(200, 150)"))
    boxed = annotate.draw_action(png, annotate.action_mark("click('1')", {"action_bbox": [10, 120, 60, 30]}))
    assert plain.size == clicked.size == (320, 200)
    assert clicked.getpixel((200, 150)) != plain.getpixel((200, 150))
    assert clicked.getpixel((20, 20)) == plain.getpixel((20, 20))
    assert boxed.getpixel((10, 135)) != plain.getpixel((10, 135))


def test_online_run_against_policy_version_warns_when_learning_stalls(monkeypatch, tmp_path):
    lake = Lake.init(str(tmp_path / "lake"))
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows = []
    for run_id, zero_std in (("online-flat", [0.25, 0.75, 0.75, 1.0]), ("online-ok", [0.75, 0.75, 0.25, 0.75])):
        for step, value in enumerate(zero_std):
            for metric, v in (("policy_version", float(step)), ("frac_reward_zero_std", value), ("success_rate/heldout", 0.1 * step)):
                rows.append({"run_id": run_id, "step": step, "metric": metric, "value": v, "logged_at": now})
    for step in range(4):  # what online-ok's updates did: rows produced and trained, how far each moved the adapter
        for metric, v in (("rows_produced", 60.0), ("rows_trained", 48.0), ("displacement_from_previous", 0.01 * (step + 1))):
            rows.append({"run_id": "online-ok", "step": step, "metric": metric, "value": v, "logged_at": now})
    append_rows(lake, "train_metrics", rows)

    at = open_app(monkeypatch, lake.root, "training")
    assert at.multiselect(key="training_runs").value == ["online-flat", "online-ok"]
    assert "Online runs, per policy_version" in texts(at)
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1
    assert warnings[0].startswith("online-flat: frac_reward_zero_std stayed above 0.5 for its last 3 iterations (0.75, 0.75, 1.00)")
    # One per-step curve (the default metric, frac_reward_zero_std), two per-version charts (held-out success, zero-std)
    # and two of what the updates did (rows; displacement).
    assert at.multiselect(key="training_metrics").value == ["frac_reward_zero_std"]
    assert "What each update did, per iteration" in texts(at)
    assert len(at.get("vega_lite_chart")) == 5


def test_overview_shows_cost_per_mode(monkeypatch, tmp_path):
    from test_verified_actions import cost_episodes
    from test_views import build

    build(tmp_path / "lake", cost_episodes())
    at = open_app(monkeypatch, tmp_path / "lake")
    assert "Cost per mode" in texts(at)
    cost = at.dataframe[2].value.set_index("mode")
    assert cost.loc["hier", "model_calls_per_episode"] == 2.0 and cost.loc["hier", "tokens_in_per_episode"] == 165.0
    assert cost.loc["hier", "cost_usd_per_episode"] == pytest.approx(0.000385)
    assert (cost.loc["hier", "manager_call_rate"], cost.loc["hier", "cache_hit_rate"]) == (0.5, 0.25)
    per_model = at.dataframe[3].value.set_index("model")
    assert per_model.loc["gpt-4o", "role"] == "manager" and per_model.loc["gpt-4o", "tokens_in"] == 220
