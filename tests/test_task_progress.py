"""Task-aware progress: expectations files, their evaluation on /finish states, RealEnv's polling, the
task_progress reward component and what the lake and its views make of it.

Episodes run in real headless Chromium on HALO's local GoMail clone through ``RealEnv`` and the
episode loop, into a real lake; agisdk's own evaluators score them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from halo_agent import task_progress as tp
from halo_agent.envs.base import TaskSpec
from halo_agent.rewards import EpisodeRewards, RewardConfig
from halo_data import schema as S
from halo_data.lake import Lake
from halo_data.records import EpisodeRecord, StepRecord
from halo_data.writer import EpisodeWriter

GOMAIL_YAML = tp.EXPECTATIONS_DIR / "gomail.yaml"

# ----------------------------------------------------------------------------- the loader


@pytest.mark.parametrize("text, message", [
    ("v2.gomail-1: [\n", "not valid YAML (line 2)"),
    ("- a\n- b\n", "must map task ids to lists of checks, got list"),
    ("gomail-1:\n  - {description: d, query: a, expected_value: true}\n", "task id 'gomail-1' must be VERSION.NAME"),
    ("v2.gomail-1: []\n", "v2.gomail-1: must be a non-empty list of checks"),
    ("v2.gomail-1:\n  - {description: d, query: a}\n", "v2.gomail-1[0]: missing expected_value"),
    ("v2.gomail-1:\n  - {description: d, query: a, expected_value: 1, weight: 2}\n", "v2.gomail-1[0]: unknown field(s) weight"),
    ("v2.gomail-1:\n  - {description: '', query: a, expected_value: 1}\n", "v2.gomail-1[0]: description must be a non-empty string"),
    ("v2.gomail-1:\n  - {description: d, query: 'length(differences.emails[', expected_value: 1}\n",
     "v2.gomail-1[0] (d): bad JMESPath query 'length(differences.emails['"),
    ("v2.gomail-1:\n  - just a string\n", "v2.gomail-1[0]: a check must be a mapping"),
])
def test_a_malformed_expectations_file_is_refused_with_one_clear_line(tmp_path, text, message):
    bad = tmp_path / "site.yaml"
    bad.write_text(text)
    with pytest.raises(tp.ExpectationsError) as caught:
        tp.load_file(bad)
    error = str(caught.value)
    assert error.startswith(f"{bad}: ") and message in error and "\n" not in error


def test_the_check_command_says_ok_or_one_error_line_and_exit_1(tmp_path):
    run = lambda *args: subprocess.run([sys.executable, "-m", "halo_agent.task_progress", "check", *args],
                                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    ok = run(str(GOMAIL_YAML))
    assert ok.returncode == 0 and ok.stdout.strip().startswith("ok: 21 tasks")
    bad = tmp_path / "omnizon.yaml"
    bad.write_text("v2.omnizon-1:\n  - {description: d, query: 'a[', expected_value: 1}\n")
    refused = run(str(bad))
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith(f"error: {bad}: v2.omnizon-1[0] (d): bad JMESPath query")


def test_every_site_file_in_the_folder_is_read_and_a_task_may_have_one_entry(tmp_path):
    (tmp_path / "omnizon.yaml").write_text(
        "v2.omnizon-13:\n  - {description: an order was placed, query: 'length(differences.orders.added)', expected_value: 1}\n")
    (tmp_path / "gocalendar.yaml").write_text(
        "v2.gocalendar-2:\n  - {description: an event was added, query: 'length(differences.events.added) > `0`', expected_value: true}\n")
    table = tp.load_all([tmp_path])
    assert sorted(table) == ["v2.gocalendar-2", "v2.omnizon-13"]
    assert table["v2.omnizon-13"].share({"differences": {"orders": {"added": [{"id": 1}]}}}) == 1.0
    # A file added later is read on the next load.
    (tmp_path / "staynb.yaml").write_text("v2.staynb-1:\n  - {description: d, query: a, expected_value: 1}\n")
    assert "v2.staynb-1" in tp.load_all([tmp_path])
    (tmp_path / "copy.yaml").write_text((tmp_path / "omnizon.yaml").read_text())
    with pytest.raises(tp.ExpectationsError, match=r"omnizon.yaml: v2.omnizon-13 is also in .*copy.yaml; give each task one entry"):
        tp.load_all([tmp_path])


def test_a_check_is_agisdks_jmespath_eval_and_local_tasks_evals_count_directly():
    check = tp.Check.make("n sent", "length(differences.emails.added[?sent])", 1)
    assert check.holds({"differences": {"emails": {"added": [{"sent": True}]}}})
    assert not check.holds({"differences": {"emails": {"added": []}}})
    assert not check.holds({})  # length(null) raises in JMESPath: not satisfied, as agisdk scores it
    from halo_agent import registry

    local = {t.task_id: t for t in registry.list_real_tasks("halo-local")}["halo-local.gomail-local-1"]
    own = tp.expectations_for(local)
    assert own.source == "task evals" and [c.query for c in own.checks] == [e["query"] for e in local.extra["evals"]]
    scripted = TaskSpec("v2.dashdish-1", "real", "dashdish", "v2", extra={"evals": [{"type": "script", "script": "x.py"}]})
    assert tp.expectations_for(scripted) is None
    assert tp.expectations_for(TaskSpec("v2.gomail-18", "real", "gomail", "v2")).source == str(GOMAIL_YAML)


def test_gomail_expectations_cover_the_v2_tasks_and_none_holds_on_an_untouched_mailbox():
    from halo_agent import registry

    table = tp.load_file(GOMAIL_YAML)
    v2_gomail = {t.task_id for t in registry.list_real_tasks("v2") if t.site == "gomail"}
    assert set(table) == v2_gomail and len(v2_gomail) == 21
    untouched = {"differences": {"emails": {"added": [], "deleted": [], "updated": []}},
                 "initialfinaldiff": {"added": {"email": {"emails": {}}}, "deleted": {"email": {"emails": {}}},
                                      "updated": {"email": {"emails": {}}}}}
    assert {t: e.share(untouched) for t, e in table.items()} == dict.fromkeys(table, 0.0)


# ----------------------------------------------------------------------------- the reward component


def test_the_component_is_the_change_of_the_share_and_sums_to_the_final_share():
    config = RewardConfig.load()
    rewards = EpisodeRewards(config, "gomail", task_share=0.0)
    shares = [0.25, 0.25, None, 0.75, 0.5, 1.0]  # None: not measured at that step (e.g. no action ran)
    parts = [rewards.step(state_hash=f"s{i}", action="noop()", action_valid=True, task_share=s).components["task_progress"]
             for i, s in enumerate(shares)]
    assert parts == pytest.approx([0.25, 0.0, 0.0, 0.5, -0.25, 0.5]) and sum(parts) == pytest.approx(1.0)
    step = rewards.step(state_hash="s9", action="noop()", action_valid=True, task_share=1.0)
    assert step.reward == pytest.approx(config.weights.shaped(step.components))
    unmeasured = EpisodeRewards(config, "miniwob").step(state_hash="a", action="click('1')", action_valid=True)
    assert unmeasured.components["task_progress"] is None  # NULL in the lake: no expectations, nothing measured


def _row(task_id: str, attempt: int, steps: list[dict]) -> tuple[EpisodeRecord, list[StepRecord]]:
    episode = EpisodeRecord(run_id="r", env="real", task_id=task_id, site="gomail", task_seed=0, attempt_idx=attempt,
                            success=False, n_steps=len(steps))
    return episode, [StepRecord(step_idx=i, action="noop()", action_valid=True, rewards=r,
                                cumulative_progress=sum(x.get("progress", 0) for x in steps[: i + 1])) for i, r in enumerate(steps)]


def test_progress_ranking_puts_task_progress_before_milestones_and_an_older_lake_reads_null(tmp_path):
    # An older lake: steps written before r_task_progress existed.
    root = tmp_path / "lake"
    old_steps = S.TableSpec(S.STEPS.name, S.STEPS.doc, S.STEPS.partition_by,
                            tuple(c for c in S.STEPS.columns if c.name != "r_task_progress"))
    from deltalake import DeltaTable, write_deltalake

    lake = Lake.init(root)
    uri = lake.table_uri("steps")
    import shutil

    shutil.rmtree(uri)
    DeltaTable.create(uri, schema=old_steps.schema, partition_by=list(old_steps.partition_by))
    old = {c: None for c in old_steps.column_names} | {"run_id": "old", "env": "real", "episode_id": "e-old", "task_id": "v2.gomail-1",
                                                        "step_idx": 0, "r_progress": 0.5, "is_last": True, "success": False}
    write_deltalake(uri, pa.Table.from_pylist([old], schema=old_steps.schema), mode="append")

    lake = Lake.init(root)  # adds the new column; the old rows read it as NULL
    writer = EpisodeWriter(lake)
    # Milestones favour the flailing episode; the task-aware share favours the partial solution.
    writer.write_episode(*_row("v2.gomail-1", 0, [{"progress": 0.4, "task_progress": 0.0}, {"progress": 0.2, "task_progress": 0.0}]))
    writer.write_episode(*_row("v2.gomail-1", 1, [{"progress": 0.1, "task_progress": 1 / 6}, {"task_progress": 2 / 6}]))
    writer.close()
    steps = lake.query_arrow("select episode_id, step_idx, r_task_progress from steps order by episode_id, step_idx").to_pylist()
    assert [s["r_task_progress"] for s in steps if s["episode_id"] == "e-old"] == [None]
    assert sorted(s["r_task_progress"] for s in steps if s["episode_id"] != "e-old") == pytest.approx([0.0, 0.0, 1 / 6, 2 / 6])
    ranked = lake.query_arrow("select attempt_idx, run_id, final_task_progress, final_progress, rank, shaped_return "
                              "from progress_ranking order by rank, run_id").to_pylist()
    assert [(r["run_id"], r["attempt_idx"], r["rank"]) for r in ranked] == [("r", 1, 1), ("r", 0, 2), ("old", None, 3)]
    assert ranked[0]["final_task_progress"] == pytest.approx(0.5) and ranked[1]["final_progress"] == pytest.approx(0.6)
    assert ranked[2]["final_task_progress"] is None
    # The shaped return counts the component at its weight, and the views re-weight it without new rollouts.
    def shaped(**weights):
        rows = lake.query_arrow("select shaped_return from episodes where run_id = 'r' order by attempt_idx", params=weights)
        return rows.column("shaped_return").to_pylist()

    assert shaped() == pytest.approx([0.6, 0.1 + 1.5])  # weight 3.0 by default
    assert shaped(w_task_progress=2.0) == pytest.approx([0.6, 0.1 + 1.0])
    assert shaped(w_task_progress=0.0) == pytest.approx([0.6, 0.1])



# ----------------------------------------------------------------------------- expectations against agisdk's eval scripts
# /finish states in the shape the scripts read (whole emails in differences, the changed fields in
# initialfinaldiff), with the hosted GoMail's ids and counts where a script names them.


def email(id, frm="someone@example.com", subject="Hello", content="Hi", **fields) -> dict:
    return {"id": str(id), "from": frm, "to": ["me@example.com"], "cc": [], "bcc": [], "subject": subject, "content": content,
            "isRead": False, "starred": False, "sent": False, "draft": False, "spam": False, "trash": False, "archived": False,
            **fields}


def sent(to: str, subject: str, content: str, **fields) -> dict:
    return email("new-1", "me@example.com", subject, content, to=[to], sent=True, isRead=True, **fields)


def trash(ids, **fields) -> list[dict]:
    return [email(i, trash=True, **fields) for i in ids]


def state(added=(), updated=(), snackbar: str | None = None) -> dict:
    changed = {e["id"]: {k: e[k] for k in ("trash", "isRead", "archived") if e[k]} for e in updated}
    ifd_updated = {"email": {"emails": changed}, **({"ui": {"snackbar": {"message": snackbar}}} if snackbar else {})}
    return {"differences": {"emails": {"added": list(added), "updated": list(updated), "deleted": []}},
            "initialfinaldiff": {"added": {"email": {"emails": {e["id"]: e for e in added}}}, "deleted": {}, "updated": ifd_updated}}


# (a state a correct solution leaves, a partial one) on the hosted GoMail's data, as the scripts know it
SCRIPT_CASES = {
  "v2.gomail-1": [state(updated=[email(i, isRead=True) for i in range(10, 25)] + trash([1, 2, 3, 4], frm="order@amazon.com", isRead=True)),
                  state(updated=trash([1], frm="order@amazon.com", isRead=True))],
  "v2.gomail-2": [state(updated=trash([48], frm="noreply@uber.com") + trash([3], frm="notifications@x.com")),
                  state(updated=trash([48], frm="noreply@uber.com"))],
  "v2.gomail-4": [state(added=[sent("alexa.richardson@example.com", "Files", "Please let me know when the files come in.")]),
                  state(added=[sent("alexa.richardson@example.com", "Files", "Hello")])],
  "v2.gomail-5": [state(updated=trash([2, 6, 10, 14, 16, 21, 26, 28, 31, 37, 47, 49, 53]),
                        added=[sent("alexa.richardson@example.com", "Work permit", "Can you sign it?")]),
                  state(added=[sent("alexa.richardson@example.com", "Work permit", "Can you sign it?")])],
  "v2.gomail-7": [state(added=[sent("ashley.campbell@example.com", "Team dinner", "Are you coming to the team dinner?")]),
                  state(added=[sent("ashley.campbell@example.com", "Hi", "Hello")])],
  "v2.gomail-8": [state(added=[sent("kevin.moore@example.com", "Project", "Could you send me the project details?")]),
                  state(added=[sent("kevin.moore@example.com", "Project", "Hello", cc=["x@example.com"])])],
  "v2.gomail-9": [state(added=[sent("barbara.thomas@example.com", "Project plan", "Let's discuss.")]),
                  state(added=[sent("barbara.thomas@example.com", "Hi", "Hello")])],
  "v2.gomail-12": [state(added=[sent("charles.davis@example.com", "Clients", "Have you found any new clients?")]),
                   state(added=[sent("charles.davis@example.com", "Hi", "Hello")])],
  "v2.gomail-13": [state(added=[sent("carol.adams@example.com", "Time change", "The meeting is now at 8:30 AM.")]),
                   state(added=[sent("carol.adams@example.com", "Time change", "The meeting moved.")])],
  "v2.gomail-14": [state(updated=trash(range(1, 21)), snackbar="20 conversations moved to Trash")],
  "v2.gomail-15": [state(added=[sent("danielle.x@example.com", "Update", "The new system update has been launched.")]),
                   state(added=[sent("danielle.x@example.com", "Update", "Hello")])],
  "v2.gomail-17": [state(updated=[email(i, archived=True) for i in (46, 47, 48)]), state(updated=[email(46, archived=True)])],
  "v2.gomail-18": [state(added=[sent("brian.king@example.com", "Meeting notes", "Could you send me the meeting notes?")]),
                   state(added=[sent("brian.king@example.com", "Meeting notes", "Hi there")])],
  "v2.gomail-19": [state(added=[sent("angela.white@example.com", "FTA", "When do you go on FTA?")]),
                   state(added=[sent("angela.white@example.com", "Hi", "Hello")])],
  "v2.gomail-20": [state(updated=trash(range(1, 55)), snackbar="54 conversations moved to Trash"), state(updated=trash(range(1, 12)))],
  "v2.gomail-23": [state(added=[sent("jane.smith@example.com", "Re: Hi", "Thanks", isReply=True)], updated=trash(range(1, 14), subject="Support ticket")),
                   state(updated=trash(range(1, 14), subject="Support ticket"))],
  "v2.gomail-24": [state(updated=trash([1], frm="john.doe@example.com")), state(updated=trash([2], frm="john.doe@example.com"))],
  "v2.gomail-26": [state(updated=trash([3, 14, 34, 40, 50], frm="noreply@x.com")), state(updated=trash([3, 14], frm="noreply@x.com"))],
  "v2.gomail-11": [state(updated=trash([52, 53, 54, 55, 56], date="2024-04-01") + [email(1, isRead=True, date="2024-07-18")]),
                   state(updated=trash([5], date="2024-07-01"))],
}


@pytest.mark.parametrize("task_id", sorted(SCRIPT_CASES))
def test_gomail_expectations_all_hold_where_the_eval_script_succeeds_and_partly_on_a_partial_state(task_id, tmp_path):
    import agisdk

    scripts = Path(agisdk.__file__).parent / "REAL/browsergym/webclones/v2/eval_scripts"
    expectations = tp.load_file(GOMAIL_YAML)[task_id]

    def script_says(state: dict) -> str:
        path = tmp_path / "finish.json"
        path.write_text(json.dumps(state))
        run = subprocess.run([sys.executable, str(scripts / f"eval_{task_id.split('.')[1].replace('-', '_')}.py"), str(path)],
                             capture_output=True, text=True)
        return run.stdout.strip()

    solved, *partial = SCRIPT_CASES[task_id]
    assert script_says(solved) == "SUCCESS" and expectations.share(solved) == 1.0
    for state in partial:
        assert script_says(state) == "FAILURE" and 0.0 < expectations.share(state) < 1.0


# ----------------------------------------------------------------------------- episodes (real Chromium)

pytest.importorskip("agisdk")


@pytest.fixture(scope="module")
def gomail_site():
    from halo_agent.sites import LocalSite

    with LocalSite("gomail") as site:
        yield site


PARTIAL_1 = [("click", "Alice Chen — Project kickoff"), ("click", "Back to inbox"), ("click", "Delete Your order has shipped"),
             ("answer", "I read one email and deleted the Amazon one.")]
FULL_18 = [("click", "Compose"), ("fill", "To", "brian.king@example.com"), ("fill", "Subject", "Meeting notes"),
           ("fill", "Message Body", "Hi Brian, could you please send me the meeting notes?"), ("click", "Send"),
           ("answer", "I asked Brian King to send the meeting notes.")]
IRRELEVANT_18 = [("click", "Sent"), ("click", "Trash"), ("click", "Inbox"), ("answer", "Done.")]


@pytest.mark.browser
@pytest.mark.slow
def test_scripted_episodes_rise_reach_one_and_an_irrelevant_run_stays_zero_in_the_lake(gomail_site, tmp_path):
    from halo_agent.policies.scripted_policy import ScriptedPolicy
    from halo_agent.rollout import RolloutConfig, plan_episodes, resolve_tasks
    from halo_agent.rollout.workers import run_in_process

    lake = Lake.init(tmp_path / "lake")
    for run_id, task, plan in (("partial", "v2.gomail-1", PARTIAL_1), ("full", "v2.gomail-18", FULL_18),
                               ("irrelevant", "v2.gomail-18", IRRELEVANT_18)):
        config = RolloutConfig(env="real", tasks=[task], max_steps=len(plan), lake=str(lake.root), run_id=run_id, progress=False,
                               env_options={"site_urls": {"gomail": gomail_site.url}, "screenshot": False})
        writer = EpisodeWriter(lake)
        run_in_process(config, run_id, plan_episodes(config, run_id, resolve_tasks(config)),
                       lambda r: writer.write_episode(r.episode, r.steps, r.screenshots), ScriptedPolicy(plan))
        writer.close()
    steps = lake.query_arrow("select run_id, step_idx, r_task_progress, r_progress, success, extra from steps "
                             "order by run_id, step_idx").to_pylist()
    by_run = {run: [s for s in steps if s["run_id"] == run] for run in ("partial", "full", "irrelevant")}
    # Partial (gomail-1, six checks): reading an email meets one; deleting the Amazon email two more.
    assert [s["r_task_progress"] for s in by_run["partial"]] == pytest.approx([1 / 6, 0.0, 2 / 6, 0.0])
    assert not by_run["partial"][0]["success"]
    # Full (gomail-18): the sent email meets all four checks; agisdk's eval script says SUCCESS.
    assert [s["r_task_progress"] for s in by_run["full"]] == pytest.approx([0.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    assert by_run["full"][0]["success"]
    # Irrelevant clicking: measured (0, not NULL) and never rising, though milestones are blind to it either way.
    assert [s["r_task_progress"] for s in by_run["irrelevant"]] == [0.0] * 4
    assert not by_run["irrelevant"][0]["success"]
    # What was polled is on the step: share, satisfied checks and what the read cost.
    measured = [json.loads(s["extra"])["env_info"]["task_progress"] for s in by_run["partial"]]
    assert [m["share"] for m in measured] == pytest.approx([1 / 6, 1 / 6, 0.5, 0.5])
    assert measured[2]["satisfied"] == [True, False, False, True, True, False]
    assert all(m["poll_ms"] > 0 for m in measured[:-1]) and measured[-1]["poll_ms"] == 0  # the answer reuses agisdk's read
    episodes = lake.query_arrow("select run_id, final_task_progress, success from episodes order by run_id").to_pylist()
    assert [(e["run_id"], round(e["final_task_progress"], 6), e["success"]) for e in episodes] == [
        ("full", 1.0, True), ("irrelevant", 0.0, False), ("partial", 0.5, False)]

    # A state restored by replay carries its share, and online GRPO's candidates are scored with it: from the partial
    # run's third state, deleting the Amazon email (+2/6 of the checks) against opening the Sent folder (none).
    from halo_agent.candidates import score_candidates
    from halo_agent.envs.real import RealEnv
    from halo_agent.restore import StatePath, restore_state
    from halo_agent.rewards import RewardConfig
    from halo_agent.types import PolicyOutput

    rewards = RewardConfig.load()
    config = RolloutConfig(env="real", tasks=["v2.gomail-1"], lake=str(lake.root), progress=False)
    partial = lake.query_arrow("select step_idx, action, state_hash, goal from steps where run_id = 'partial'").to_pylist()
    path = StatePath.from_steps(resolve_tasks(config)[0], 0, partial, 2)
    env = RealEnv(site_urls={"gomail": gomail_site.url}, screenshot=False)
    try:
        restored = restore_state(env, path, rewards)
        assert restored.restored and restored.rewards.task_share == pytest.approx(1 / 6)
        bid = {e.name: e.bid for e in restored.page.elements}
        samples = [PolicyOutput(model_output=a, action=a) for a in
                   (f"click('{bid['Delete Your order has shipped']}')", f"click('{bid['Sent']}')")]
        group = score_candidates(env, path, samples, rewards)
        assert group.scores[0] - group.scores[1] == pytest.approx(rewards.weights.task_progress * 2 / 6)
    finally:
        env.close()


@pytest.mark.browser
@pytest.mark.slow
def test_polling_leaves_the_agents_page_and_a_task_without_expectations_is_not_polled(gomail_site, monkeypatch):
    from halo_agent.envs.real import RealEnv

    env = RealEnv(site_urls={"gomail": gomail_site.url, "dashdish": gomail_site.url}, screenshot=False)
    reads = []
    read = env.read_finish_state
    monkeypatch.setattr(env, "read_finish_state", lambda: reads.append(1) or read())
    try:
        page = env.reset("v2.gomail-18", task_seed=0)
        assert page.extra["task_progress"]["share"] == 0.0 and len(reads) == 1
        agent_page = env._env.page
        compose = next(e.bid for e in page.elements if e.name == "Compose")
        out = env.step(f"click('{compose}')")
        assert env._env.page is agent_page and out.page.url.rstrip("/") == gomail_site.url  # still the agent's page
        assert out.info["task_progress"]["share"] == 0.0 and len(reads) == 2
        assert "button 'Send'" in out.page.axtree  # the compose dialog the action opened is still there

        # v2.dashdish-1 (its Python eval script, no expectations) on the same clone: nothing read, no component.
        page = env.reset("v2.dashdish-1", task_seed=0)
        out = env.step("noop(10)")
        assert "task_progress" not in page.extra and "task_progress" not in out.info and len(reads) == 2
    finally:
        env.close()


def test_a_malformed_expectations_folder_stops_realenv_before_any_episode(tmp_path, monkeypatch):
    from halo_agent.envs.real import RealEnv

    (tmp_path / "omnizon.yaml").write_text("v2.omnizon-1:\n  - {description: d, query: ok}\n")
    monkeypatch.setenv(tp.EXPECTATIONS_DIRS_ENV, str(tmp_path))
    with pytest.raises(tp.ExpectationsError, match=r"omnizon.yaml: v2.omnizon-1\[0\]: missing expected_value"):
        RealEnv()
    assert RealEnv(task_progress=False).task_progress is False


@pytest.mark.browser
@pytest.mark.slow
def test_a_site_whose_finish_cannot_be_read_is_left_unmeasured_after_two_tries(tmp_path):
    """A clone whose /finish shows no state: each read fails once its timeout passes; after two, no more are tried."""
    import functools
    import http.server

    from halo_agent.envs.real import RealEnv
    from halo_agent.local_http import LocalHTTPServer
    from halo_agent.rewards import task_share

    for page, body in (("index.html", "<button>Compose</button>"), ("config/index.html", "<p>configured</p>"),
                       ("finish/index.html", "<p>no state here</p>")):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text(f"<!doctype html><html><body>{body}</body></html>")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    with LocalHTTPServer(functools.partial(Quiet, directory=str(tmp_path))) as site:
        env = RealEnv(site_urls={"gomail": site.url}, screenshot=False, finish_timeout_ms=300)
        try:
            page = env.reset("v2.gomail-18", task_seed=0)
            first = env.step("noop(10)")
            second = env.step("noop(10)")
        finally:
            env.close()
    reads = [page.extra["task_progress"], first.info["task_progress"], second.info["task_progress"]]
    assert [r["share"] for r in reads] == [None, None, None]
    assert "TimeoutError" in reads[0]["error"] and reads[0]["poll_ms"] >= 300
    assert reads[2]["error"].startswith("not read: /finish failed 2 times") and reads[2]["poll_ms"] == 0
    rewards = EpisodeRewards(RewardConfig.load(), "gomail", task_share=task_share(page.extra))
    step = rewards.step(state_hash="s", action="noop(10)", action_valid=True, task_share=task_share(first.info))
    assert step.components["task_progress"] is None  # never measured: NULL, not 0
