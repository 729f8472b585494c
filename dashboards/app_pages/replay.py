"""Replay: one episode step by step — screenshot with the action drawn, the action, rewards, inputs and outputs.

Deep links: ``/replay?run=RUN&episode=EPISODE&step=N`` (the Errors page links here).
"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboards import annotate, data, reask
from halo_data.config import RewardWeights
from halo_data.schema import REWARD_COMPONENTS, reward_column

RUNS_SQL = """
SELECT run_id, count(DISTINCT episode_id) AS episodes, max(ended_at) AS last_episode_at
FROM steps
GROUP BY run_id
ORDER BY last_episode_at DESC NULLS LAST, run_id
"""

TASKS_SQL = """
SELECT task_id, count(DISTINCT episode_id) AS episodes
FROM steps
WHERE run_id = $run
GROUP BY task_id
ORDER BY task_id
"""

EPISODES_SQL = """
SELECT
    episode_id,
    any_value(attempt_idx) AS attempt_idx,
    any_value(task_seed) AS task_seed,
    any_value(success) AS success,
    any_value(error) AS error,
    count(*) AS steps,
    min(started_at) AS started_at
FROM steps
WHERE run_id = $run AND task_id = $task
GROUP BY episode_id
ORDER BY started_at, attempt_idx, episode_id
"""

EPISODE_OF_LINK_SQL = "SELECT any_value(task_id) AS task_id FROM steps WHERE run_id = $run AND episode_id = $episode"

# One episode's steps (tens of rows): every column but the logprob lists.
STEPS_SQL = """
SELECT * EXCLUDE (logprobs)
FROM step_rewards
WHERE run_id = $run AND episode_id = $episode
ORDER BY step_idx
"""


def _choose(label: str, options: list, key: str, format_func=str):
    # A remembered choice that the new options lack (another run picked) falls back to the first.
    if st.session_state.get(key) not in options:
        st.session_state[key] = options[0]
    return st.selectbox(label, options, key=key, format_func=format_func)


def _apply_link(snap: data.Snapshot) -> None:
    """Select the run / episode / step named in the URL once (links from the Errors page)."""
    link = (st.query_params.get("run"), st.query_params.get("episode"), st.query_params.get("step"))
    if not link[0] or not link[1] or st.session_state.get("replay_applied_link") == link:
        return
    st.session_state["replay_applied_link"] = link
    task = snap.scalar(EPISODE_OF_LINK_SQL, {"run": link[0], "episode": link[1]})
    if task is None or pd.isna(task):
        st.warning(f"episode {link[1]} of run {link[0]} is not in the lake (quarantined?)")
        return
    st.session_state["replay_run"] = link[0]
    st.session_state["replay_task"] = task
    st.session_state["replay_episode"] = link[1]
    st.session_state["replay_step_episode"] = link[1]
    st.session_state["replay_step"] = int(link[2]) if link[2] and str(link[2]).isdigit() else 0


def _move(delta: int, n_steps: int) -> None:
    st.session_state["replay_step"] = min(max(0, st.session_state.get("replay_step", 0) + delta), n_steps - 1)


def _show_image(snap: data.Snapshot, image_hash, caption: str, action=None, extra=None) -> None:
    if image_hash is None or pd.isna(image_hash):
        st.caption(f"{caption}: no screenshot stored")
        return
    found = snap.screenshot(image_hash)
    if found is None:
        st.caption(f"{caption}: screenshot {image_hash[:12]}… is not in the lake")
        return
    mark = annotate.action_mark(action, extra) if action is not None else None
    st.image(annotate.draw_action(found[0], mark), caption=caption, width="stretch")
    if action is not None:
        st.caption(f"action drawn at {mark.describe()}" if mark else "no coordinates or element box stored for this action")


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


def _show_prompt(prompt_json: str) -> None:
    try:
        messages = json.loads(prompt_json)
    except ValueError:
        st.code(prompt_json, language=None)
        return
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for p in content:
                if p.get("type") == "text":
                    parts.append(p.get("text", ""))
                elif p.get("type") == "image_ref":
                    parts.append(f"[image {str(p.get('hash', ''))[:12]}…]")
            content = "\n".join(parts)
        st.markdown(f"**{m.get('role', '?')}**")
        st.code(_text(content), language=None, wrap_lines=True)


def _reask_box(snap: data.Snapshot, step: pd.Series, key: str) -> None:
    endpoint = reask.Endpoint.from_env()
    if endpoint is None:
        st.caption("Set HALO_VLLM_URL (or OPENAI_BASE_URL) to ask a model again with this prompt.")
        return
    with st.expander("Ask the model again", expanded=False):
        st.caption(f"Endpoint: {endpoint.base_url}")
        stored_prompt = _text(step.get("prompt"))
        try:
            pretty = json.dumps(json.loads(stored_prompt), indent=2, ensure_ascii=False)
        except ValueError:
            pretty = stored_prompt
        edited = st.text_area("Prompt (chat messages JSON; edit freely)", pretty, height=300, key=f"reask_prompt_{key}")
        c1, c2, c3 = st.columns([2, 1, 1])
        model = c1.text_input("Model", endpoint.default_model or _text(step.get("model")), key=f"reask_model_{key}")
        temperature = c2.number_input("Temperature", 0.0, 2.0, 0.0, 0.1, key=f"reask_temperature_{key}")
        text_only = c3.checkbox("Text only", key=f"reask_text_only_{key}", help="Drop the screenshot (for text-only models).")
        result_key = f"reask_result_{key}"
        if st.button("Ask again", key=f"reask_button_{key}"):
            def load_image(image_hash: str) -> tuple[bytes, str]:
                found = snap.screenshot(image_hash)
                if found is None:
                    raise reask.ReaskError(f"screenshot {image_hash[:12]}… of the prompt is not in the lake: tick Text only")
                return found

            try:
                messages = reask.parse_messages(edited)
                with st.spinner("asking…"):
                    st.session_state[result_key] = ("ok", reask.ask(endpoint, messages, model, load_image, temperature, text_only=text_only))
            except reask.ReaskError as e:
                st.session_state[result_key] = ("error", str(e))
        if result_key in st.session_state:
            status, text = st.session_state[result_key]
            left, right = st.columns(2)
            left.markdown("**Stored output**")
            left.code(_text(step.get("model_output")), language=None, wrap_lines=True)
            right.markdown("**New output**")
            if status == "ok":
                right.code(text, language=None, wrap_lines=True)
            else:
                right.error(text)


st.title("Replay")
snap = data.current_snapshot()
if data.require_steps(snap):
    _apply_link(snap)
    runs = snap.df(RUNS_SQL)
    episodes_of_run = dict(zip(runs.run_id, runs.episodes))
    c1, c2, c3 = st.columns([2, 2, 3])
    with c1:
        run = _choose("Run", list(runs.run_id), "replay_run", lambda r: f"{r} ({episodes_of_run.get(r, 0)} episodes)")
    tasks = snap.df(TASKS_SQL, {"run": run})
    with c2:
        task = _choose("Task", list(tasks.task_id), "replay_task")
    episodes = snap.df(EPISODES_SQL, {"run": run, "task": task})
    labels = {
        r.episode_id: (
            f"attempt {r.attempt_idx} · seed {r.task_seed} · "
            f"{'error' if isinstance(r.error, str) else ('success' if r.success else 'failure')} · {r.steps} steps"
        )
        for r in episodes.itertuples()
    }
    with c3:
        episode = _choose("Episode", list(episodes.episode_id), "replay_episode", lambda e: labels.get(e, e))

    steps = snap.df(STEPS_SQL, {"run": run, "episode": episode})
    n_steps = len(steps)
    if st.session_state.get("replay_step_episode") != episode:
        st.session_state["replay_step_episode"] = episode
        st.session_state["replay_step"] = 0
    st.session_state["replay_step"] = min(max(0, int(st.session_state.get("replay_step", 0))), n_steps - 1)

    nav_prev, nav_slider, nav_next = st.columns([1, 10, 1], vertical_alignment="bottom")
    nav_prev.button("◀ Prev", key="replay_prev", on_click=_move, args=(-1, n_steps), disabled=st.session_state["replay_step"] == 0)
    nav_next.button("Next ▶", key="replay_next", on_click=_move, args=(1, n_steps), disabled=st.session_state["replay_step"] >= n_steps - 1)
    with nav_slider:
        if n_steps > 1:
            step_idx = st.slider("Step", 0, n_steps - 1, key="replay_step")
        else:
            step_idx = 0
            st.caption("This episode has one step.")
    step = steps.iloc[step_idx]
    st.query_params.update({"run": run, "episode": episode, "step": str(step_idx)})
    st.session_state["replay_applied_link"] = (run, episode, str(step_idx))

    first = steps.iloc[0]
    outcome = "error" if isinstance(first.get("error"), str) else ("success" if first.get("success") else "failure")
    st.caption(
        f"Goal: {_text(first.get('goal'))} · {outcome} · task reward {_text(first.get('task_reward'))} · "
        f"episode {episode} · step {step_idx + 1} of {n_steps}"
    )

    left, right = st.columns([3, 2])
    with left:
        _show_image(snap, step.get("screenshot_hash"), f"step {step_idx}", action=_text(step.get("action")) or None, extra=step.get("extra"))
    with right:
        st.markdown("**Action**")
        st.code(_text(step.get("action")) or "(none — the output did not parse)", language="python", wrap_lines=True)
        valid = step.get("action_valid")
        st.markdown(
            f"source **{_text(step.get('action_source')) or '?'}** · "
            f"valid **{'yes' if valid is True or valid == 1 else ('no' if valid is False or valid == 0 else '?')}**"
        )
        if _text(step.get("parse_error")):
            st.error(f"parse error: {_text(step.get('parse_error'))}")
        if _text(step.get("action_error")):
            st.error(f"action error: {_text(step.get('action_error'))}")
        st.markdown(f"URL: `{_text(step.get('url'))}`")
        weights = RewardWeights().as_dict()
        components = pd.DataFrame(
            [
                {"component": c, "raw": step.get(reward_column(c)), "weight": weights[c],
                 "weighted": (0.0 if pd.isna(step.get(reward_column(c))) else float(step.get(reward_column(c)))) * weights[c]}
                for c in REWARD_COMPONENTS
            ]
        )
        st.dataframe(components, hide_index=True, width="stretch")
        st.markdown(
            f"shaped reward **{float(step.get('shaped_reward')):.3f}** · "
            f"cumulative progress **{_text(step.get('cumulative_progress'))}**"
        )

    with st.expander("AXTree (what the policy saw)"):
        st.code(_text(step.get("observation")), language=None)
    with st.expander("Model input (prompt)"):
        st.caption(f"prompt version {_text(step.get('prompt_version'))}")
        _show_prompt(_text(step.get("prompt")))
    with st.expander("Raw model output"):
        st.code(_text(step.get("model_output")), language=None, wrap_lines=True)
    with st.expander("Before / after"):
        after_hash = step.get("screenshot_after_hash")
        if (after_hash is None or pd.isna(after_hash)) and step_idx + 1 < n_steps:
            after_hash = steps.iloc[step_idx + 1].get("screenshot_hash")
        before_col, after_col = st.columns(2)
        with before_col:
            _show_image(snap, step.get("screenshot_hash"), "before")
        with after_col:
            _show_image(snap, after_hash, "after")
    _reask_box(snap, step, f"{episode}_{step_idx}")
