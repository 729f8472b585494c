"""Small lakes of realistic episodes for tests, CI and demos of the training jobs.

    lake = Lake.init(tmp_path / "lake")
    write_fixture_episodes(lake)   # 3 tasks x 4 attempts: bc_rows, dpo_pairs and grpo_groups all non-empty

The episodes look like MiniWoB++ rollouts of a model policy: prompts from the
versioned renderer, completions such as ``click('12')``, reward components per
step, a success reward on the last step. Attempts of one task share a task_seed
and a policy_version (so they form GRPO groups) and start from the same page (so
their first steps share a prompt and an anchor state). The last task's attempts
all act alike and get equal rewards: a zero-std group the GRPO job must skip.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Callable, Iterator, Sequence

from halo_data import ids, prompts
from halo_data.lake import Lake
from halo_data.records import EpisodeRecord, StepRecord
from halo_data.writer import EpisodeWriter

# (prompt JSON, completion) -> behaviour log-probability of the completion.
LogprobFn = Callable[[str, str], float]

_ELEMENTS = (("button", "Submit"), ("link", "Home"), ("button", "Cancel"), ("textbox", "Name"), ("checkbox", "Remember"))


def _observation(task_idx: int, page: int) -> str:
    lines = [f"RootWebArea 'Task {task_idx} page {page}'"]
    for k, (role, name) in enumerate(_ELEMENTS):
        lines.append(f"  [{10 + k + 5 * page}] {role} '{name}'")
    return "\n".join(lines)


def write_fixture_episodes(
    lake: Lake,
    run_id: str = "fixture-rollout",
    n_tasks: int = 3,
    attempts: int = 4,
    n_steps: int = 2,
    policy_version: str | None = "0",
    logprob_fn: LogprobFn | None = None,
) -> list[str]:
    """Write ``n_tasks x attempts`` episodes of ``n_steps`` steps; returns their episode ids."""
    started = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
    episode_ids: list[str] = []
    with EpisodeWriter(lake, flush_episodes=max(1, n_tasks * attempts)) as writer:
        for t in range(n_tasks):
            task_id = f"miniwob.fixture-task-{t}"
            goal = f"Click the Submit button (task {t})."
            uniform = t == n_tasks - 1 and n_tasks > 1
            for a in range(attempts):
                history: list[str] = []
                steps = []
                progress = 0.0
                # Even attempts find the right element at the last step; odd ones click elsewhere.
                succeeds = (a % 2 == 0) and not uniform
                for i in range(n_steps):
                    url = f"file:///miniwob/fixture-task-{t}.html"
                    observation = _observation(t, i)
                    last = i == n_steps - 1
                    right = str(10 + 5 * i)  # the Submit button on this page
                    if uniform:
                        bid = str(12 + 5 * i)
                    elif last:
                        bid = right if succeeds else str(11 + 5 * i + (a % 3))
                    else:
                        bid = str(11 + 5 * i + (a % 2))  # intermediate steps differ between attempts
                    action = f"click('{bid}')"
                    messages = prompts.render_messages(goal, url, observation, history)
                    prompt = prompts.dumps(messages)
                    r_progress = 0.5 if (succeeds and last) else (0.1 if bid == str(11 + 5 * i) else 0.0)
                    progress = min(1.0, progress + r_progress)
                    r_success = 1.0 if (succeeds and last) else 0.0
                    steps.append(
                        StepRecord(
                            step_idx=i,
                            url=url,
                            goal=goal,
                            observation=observation,
                            prompt=prompt,
                            model_output=action,
                            action=action,
                            action_source="model",
                            action_valid=True,
                            rewards={"progress": r_progress, "novelty": 0.0 if i else 1.0, "loop": 0.0, "validity": 1.0,
                                     "success": r_success},
                            cumulative_progress=progress,
                            state_hash=ids.state_hash(url, observation),
                            latency_ms=5.0,
                            completion_tokens=6,
                            logprob_sum=logprob_fn(prompt, action) if logprob_fn else None,
                        )
                    )
                    history.append(action)
                episode = EpisodeRecord(
                    run_id=run_id,
                    env="miniwob",
                    task_id=task_id,
                    site="miniwob",
                    split="train",
                    mode="fixture",
                    policy="hf",
                    model="tiny",
                    policy_version=policy_version,
                    attempt_idx=a,
                    seed=a,
                    task_seed=7,
                    temperature=1.0,
                    success=succeeds,
                    task_reward=1.0 if succeeds else 0.0,
                    raw_reward=1.0 if succeeds else 0.0,
                    terminated=succeeds,
                    truncated=not succeeds,
                    started_at=started + dt.timedelta(minutes=len(episode_ids)),
                    ended_at=started + dt.timedelta(minutes=len(episode_ids), seconds=5),
                )
                episode_ids.append(writer.write_episode(episode, steps))
    return episode_ids


def fixture_prompts(n_tasks: int = 3) -> Sequence[str]:
    """The first-step prompts of the fixture tasks (what a smoke test asks a model)."""
    return [
        prompts.dumps(
            prompts.render_messages(
                f"Click the Submit button (task {t}).", f"file:///miniwob/fixture-task-{t}.html", _observation(t, 0)
            )
        )
        for t in range(n_tasks)
    ]


def warm_tiny_model(root, tasks: Sequence[str], rollouts_per_task: int = 6, max_steps: int = 3, steps: int = 30) -> str:
    """A tiny model fine-tuned on random-policy MiniWoB++ steps of ``tasks``, so its answers parse as actions."""
    from pathlib import Path

    from halo_agent.rollout import RolloutConfig, run_rollouts
    from halo_train.tiny_model import build_tiny_model

    root = Path(root)
    run_rollouts(RolloutConfig(env="miniwob", tasks=list(tasks), rollouts_per_task=rollouts_per_task, policy="random",
                               max_steps=max_steps, lake=str(root / "warm"), run_id="warm", progress=False))
    return str(build_tiny_model(root / "tiny", warmup_lake=root / "warm", steps=steps))


def small_online_config(base_model: str, root, **overrides):
    """An OnlineConfig with budgets small enough for a test (2 iterations, groups of 4, 2-step episodes,
    one optimizer step per update), its lake and adapters under ``root``; ``overrides`` change any field."""
    from pathlib import Path

    from halo_train.online import OnlineConfig

    root = Path(root)
    options = dict(base_model=base_model, tasks=["click-button", "click-test"], iterations=2, group_size=4,
                   max_episode_steps=2, train_steps=1, lr=0.01, max_tokens=24, lake=str(root / "lake"),
                   output_dir=str(root / "out"), run_id="online", progress=False)
    options.update(overrides)
    return OnlineConfig(**options)


@contextlib.contextmanager
def chat_server_in_process(model: str, **options) -> Iterator[str]:
    """HALO's chat server for ``model`` on a thread of this process: its URL, for an online or PPO run's
    ``engine_url``. The same server ``--serve`` starts, without a second process importing torch and transformers
    (about 4 CPU-seconds each); ``options`` go to ``LocalChatModel``."""
    from halo_agent.chat_server import ChatCompletionServer
    from halo_agent.policies.hf_policy import LocalChatModel

    with ChatCompletionServer(LocalChatModel(model, device="cpu", **options), None) as server:
        yield server.url
