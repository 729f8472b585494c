"""The os environment: its tasks, LifelongAgentBench's format, the action parser, and steps in the lake."""

from __future__ import annotations

import concurrent.futures
import json

import pytest

from halo_agent.envs.os_env import FINISH, OS_PROMPT_VERSION, OSEnv, RewardMap, agent_turn, parse_os_action
from halo_agent.envs.os_sandbox import Sandbox, check_host
from halo_agent.envs.os_tasks import CATEGORIES, OSTask, TaskFileError, load_tasks
from halo_agent.types import PolicyOutput

try:
    check_host()
    SANDBOX = None
except Exception as e:
    SANDBOX = str(e)
needs_sandbox = pytest.mark.skipif(SANDBOX is not None, reason=f"os sandbox unavailable: {SANDBOX}")

def lab_sample(instruction: str, init: tuple[str, str], truth: str, evaluation: tuple[str, str], skill: str) -> dict:
    """One sample of LifelongAgentBench's os_interaction JSON (scripts as (command_name, script))."""
    return {
        "instruction": instruction,
        "initialization_command_item": {"command_name": init[0], "script": init[1]},
        "evaluation_info": {
            "ground_truth_command_item": {"command_name": "bash", "script": truth},
            "evaluation_command_item": {"command_name": evaluation[0], "script": evaluation[1]},
        },
        "skill_list": [skill],
        "raw_entry_hash": instruction[:8],
    }


LAB_SAMPLES = {
    "0": lab_sample("Create a user named lab-user.", ("bash", "true"), "useradd lab-user", ("bash", "id lab-user"), "useradd"),
    "1": lab_sample("Write 42 into /srv/answer.", ("python", "import os; os.makedirs('/srv', exist_ok=True)"), "echo 42 > /srv/answer",
                    ("python", "import sys; sys.exit(open('/srv/answer').read().strip() != '42')"), "echo"),
}


def test_halo_ships_at_least_30_tasks_over_every_category():
    tasks = load_tasks()
    assert len(tasks) >= 30
    assert {t.category for t in tasks} == set(CATEGORIES)
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert sum(t.short for t in tasks) >= 10


def reference_check(task) -> tuple | None:
    """None when the instance's evaluation fails after its init alone and passes after its reference solution."""
    with Sandbox() as box:
        init = box.run(task.init.script, interpreter=task.init.interpreter)
        before = box.run(task.evaluation.script, interpreter=task.evaluation.interpreter)
        box.run(task.solution.script, interpreter=task.solution.interpreter)
        after = box.run(task.evaluation.script, interpreter=task.evaluation.interpreter)
    if init.exit_code != 0 or before.exit_code == 0 or after.exit_code != 0:
        return (task.task_id, task.task_seed, init.exit_code, before.exit_code, after.exit_code, init.output[-200:], after.output[-200:])
    return None


TASK_SEEDS = (1, 2)


def test_the_task_seed_changes_most_goals_and_names_one_instance_everywhere():
    tasks = load_tasks()
    first, second = ([t.instance(seed) for t in tasks] for seed in TASK_SEEDS)
    changed = [a.task_id for a, b in zip(first, second) if a.instruction != b.instruction]
    assert len(changed) >= 30, f"only {len(changed)} of {len(tasks)} goals change with the task seed"
    assert all("{{" not in t.instruction + t.init.script + t.evaluation.script + t.solution.script for t in first)
    # The same seed is the same instance, through a TaskSpec (as a rollout worker gets it) too.
    spec = tasks[0].to_spec(TASK_SEEDS[0])
    assert spec.goal == first[0].instruction == OSTask.from_spec(spec).instance(TASK_SEEDS[0]).instruction
    assert OSEnv.list_tasks(task_seed=TASK_SEEDS[1])[0].goal == second[0].instruction


@needs_sandbox
@pytest.mark.slow
@pytest.mark.parametrize("source", ["halo", "lifelongagentbench"])
def test_every_evaluation_fails_before_the_reference_solution_and_passes_after(source, tmp_path):
    if source == "halo":
        tasks = load_tasks()
        instances = [t.instance(seed) for t in tasks for seed in TASK_SEEDS]
        # An instance its seed does not change (the same scripts) is checked once.
        distinct = {(t.task_id, t.instruction, t.init.script, t.evaluation.script, t.solution.script): t for t in instances}
        instances = list(distinct.values())
        assert len(instances) > len(tasks)
    else:
        (tmp_path / "lab.json").write_text(json.dumps(LAB_SAMPLES))
        instances = [t.instance(0) for t in load_tasks(tmp_path / "lab.json")]
    # Each check is a sandbox of its own: four at a time (they mostly wait on their processes).
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        wrong = [failure for failure in pool.map(reference_check, instances) if failure]
    assert wrong == []


def test_bad_templates_are_one_clear_error(tmp_path):
    path = tmp_path / "tasks.yaml"
    path.write_text("tasks: [{id: a, instruction: 'make {{nme}}', evaluation: 'true', solution: 'true', params: {name: {choice: [x]}}}]")
    with pytest.raises(TaskFileError, match="task a: .*no parameter 'nme'"):
        load_tasks(path)
    path.write_text("tasks: [{id: a, instruction: x, evaluation: 'true', solution: 'true', params: {n: {int: [5]}}}]")
    with pytest.raises(TaskFileError, match=r"parameter n: int takes \[lo, hi\]"):
        load_tasks(path)


def test_lifelongagentbench_json_becomes_tasks(tmp_path):
    path = tmp_path / "os_interaction.json"
    path.write_text(json.dumps(LAB_SAMPLES))
    tasks = load_tasks(path)
    assert [t.task_id for t in tasks] == ["os.lab-0", "os.lab-1"]
    assert tasks[1].init.interpreter == "python" and tasks[1].solution.script == "echo 42 > /srv/answer"
    assert tasks[0].skills == ("useradd",) and tasks[0].source == "lifelongagentbench"
    spec = OSEnv.list_tasks(task_file=str(path))[0]
    assert spec.env == "os" and spec.site == "lab" and spec.goal == "Create a user named lab-user."


@pytest.mark.parametrize(
    "content,error",
    [
        ('{"0": {"instruction": "x"}}', "has no initialization_command_item"),
        ("tasks: [{id: a, instruction: x, evaluation: 'true'}]", "needs a non-empty solution"),
        ("tasks: [{id: a, instruction: x, evaluation: 'true', solution: y, colour: red}]", "unknown field(s) colour"),
        ("[1, 2]", "holds neither HALO tasks"),
        ("tasks: [{id: a", "cannot be parsed"),
    ],
)
def test_bad_task_files_are_one_clear_error(tmp_path, content, error):
    path = tmp_path / ("tasks.json" if content.startswith("{") else "tasks.yaml")
    path.write_text(content)
    with pytest.raises(TaskFileError, match=error.replace("(", r"\(").replace(")", r"\)")):
        load_tasks(path)


@pytest.mark.parametrize(
    "text,action",
    [
        ("Think: list it.\nAct: bash\n```bash\nls -la /srv\n```", "ls -la /srv"),
        ("Act: finish", FINISH),
        ("Think: done\nAct: Finish", FINISH),
        ("```bash\nuseradd alice\n```", "useradd alice"),
        ("Act: bash\n```bash\ncd /srv\n```\n```bash\nls\n```", "cd /srv\n\nls"),
    ],
)
def test_parse_os_action(text, action):
    assert parse_os_action(text) == (action, None)


@pytest.mark.parametrize("text", ["", "ls -la", "Act: bash\nls", "Act: answer(3)"])
def test_unparseable_answers_say_why(text):
    action, error = parse_os_action(text)
    assert action is None and error


def test_the_recorded_agent_turn_parses_back_to_its_action():
    for action in ("chmod 600 /srv/key", FINISH, "for f in *; do echo $f; done"):
        assert parse_os_action(agent_turn(action)) == (action, None)


def test_reward_map_parses_and_refuses_unknown_outcomes():
    assert RewardMap.parse(None).as_dict() == {"correct": 1.0, "incorrect": -0.5, "unknown": 0.0}
    assert RewardMap.parse("correct=2,unknown=-1").as_dict() == {"correct": 2.0, "incorrect": -0.5, "unknown": -1.0}
    with pytest.raises(ValueError, match="unknown outcome"):
        RewardMap.parse("right=1")
    with pytest.raises(ValueError, match="outcome=value"):
        RewardMap.parse("correct")


class ScriptedPolicy:
    """Answers each step with the next of ``answers`` (model text), as a model policy would."""

    name = "scripted"
    model = adapter = None
    policy_version = "scripted-v1"
    uses_screenshot = False

    def __init__(self, answers):
        self.answers = answers
        self.i = 0

    def reset(self, seed):
        self.i = 0

    def act(self, obs):
        from halo_agent.actions import parse_for_observation

        text = self.answers[min(self.i, len(self.answers) - 1)]
        self.i += 1
        action, error = parse_for_observation(text, obs)
        return PolicyOutput(model_output=text, action=action, parse_error=error, logprobs=[-0.5, -0.25])

    def close(self):
        pass


def _run_episode(lake, task_id, answers, run_id="os-test", **env_options):
    """One episode of ``task_id``; ``{solution}`` in an answer is the reference solution of the episode's instance."""
    from halo_agent.rewards import RewardConfig
    from halo_agent.rollout import EpisodeRunner, RolloutConfig, plan_episodes
    from halo_data.writer import EpisodeWriter

    config = RolloutConfig(env="os", tasks=[task_id], lake=str(lake.root), run_id=run_id, policy="scripted")
    task = next(t for t in OSEnv.list_tasks() if t.task_id == task_id)
    spec = plan_episodes(config, run_id, [task])[0]
    solution = OSTask.from_spec(task).instance(spec.task_seed).solution.script
    answers = [a.replace("{solution}", solution) for a in answers]
    env = OSEnv(**env_options)
    try:
        result = EpisodeRunner(config, run_id, env, ScriptedPolicy(answers), RewardConfig.load()).run(spec)
    finally:
        env.close()
    writer = EpisodeWriter(lake)
    writer.write_episode(result.episode, result.steps)
    writer.close()
    return result


@needs_sandbox
def test_a_solved_task_lands_in_the_lake_as_os_steps_with_reward_one(lake):
    answers = ["Think: make it\nAct: bash\n```bash\n{solution}\n```", "Act: finish"]
    result = _run_episode(lake, "os.users-add", answers)
    solution = result.steps[0].action
    assert solution.startswith("useradd ")
    assert result.episode.success and result.episode.task_reward == 1.0 and result.episode.terminated
    rows = lake.query_arrow(
        "select env, site, step_idx, action, prompt, prompt_version, observation, r_success, logprobs "
        "from steps order by step_idx"
    ).to_pylist()
    assert [r["action"] for r in rows] == [solution, FINISH]
    assert {r["env"] for r in rows} == {"os"} and rows[0]["site"] == "users"
    assert {r["prompt_version"] for r in rows} == {OS_PROMPT_VERSION}
    second_prompt = json.loads(rows[1]["prompt"])
    assert [m["role"] for m in second_prompt] == ["system", "user", "assistant", "user"]
    assert second_prompt[1]["content"] == f"Create a user account named {solution.split()[-1]}."  # the instance's goal
    assert second_prompt[2]["content"] == agent_turn(solution)
    assert rows[1]["observation"] == "The output of the OS is empty."
    assert [r["r_success"] for r in rows] == [0.0, 1.0]
    assert rows[0]["logprobs"] == [-0.5, -0.25]
    episodes = lake.query_arrow("select success, task_reward, n_steps from episodes").to_pylist()
    assert episodes == [{"success": True, "task_reward": 1.0, "n_steps": 2}]


@needs_sandbox
def test_round_limit_and_unparseable_answers_end_in_an_evaluated_episode(lake):
    wrong = _run_episode(lake, "os.users-add", ["Act: bash\n```bash\nls\n```"], run_id="os-wrong", max_rounds=2)
    assert wrong.episode.n_steps == 2 and wrong.episode.task_reward == -0.5 and not wrong.episode.success
    assert wrong.steps[-1].rewards["success"] == -0.5
    babble = _run_episode(lake, "os.users-add", ["I am not sure."], run_id="os-babble", reward_map="incorrect=-1")
    assert babble.episode.n_steps == 5 and babble.episode.terminated and babble.episode.task_reward == -1.0
    assert all(s.parse_error for s in babble.steps)
    assert babble.steps[-1].rewards["success"] == -1.0


@needs_sandbox
def test_flooding_output_reaches_the_lake_truncated_with_the_marker(lake):
    answers = ["Act: bash\n```bash\nyes | head -c 3000000\n```", "Act: finish"]
    _run_episode(lake, "os.users-add", answers, output_limit=1000)
    observation = lake.query_arrow("select observation from steps where step_idx = 1").to_pylist()[0]["observation"]
    assert observation.endswith("[... output truncated: 2999000 more bytes]")
    assert len(observation) < 1200


@needs_sandbox
def test_rollout_cli_with_the_random_policy_and_two_workers(tmp_path):
    from click.testing import CliRunner

    from halo_agent.cli import main

    lake_dir = tmp_path / "lake"
    result = CliRunner().invoke(main, ["rollout", "--env", "os", "--subset", "users", "--sample-size", "2", "--workers", "2",
                                       "--lake", str(lake_dir), "--run-id", "os-random", "--no-progress", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["episodes_written"] == 2 and summary["env_errors"] == 0
