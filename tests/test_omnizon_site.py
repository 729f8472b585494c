"""Omnizon, the local REAL shop: agisdk's own v2 Omnizon tasks, scored by their unchanged eval scripts.

Each of the 10 v2 tasks has a scripted solution, a plausible wrong run and a partial run, all
driven with BrowserGym action strings (``fill('26', 'cooking pot')``, ``click('31')``) chosen
from the page's AXTree elements by role and accessible name, as an agent would. All 10 run
in one headless Chromium (HALO's ``BrowserSession``; /config resets the shop per episode, as
agisdk's task set-up does) and are scored by agisdk's ``WebCloneEvaluator`` with the task's
``eval_omnizon_*.py``; a few run
whole through ``RealEnv`` (agisdk's ``BrowserEnv``, its /config and /finish handling and its
scoring), which is what rollouts do. Omnizon's progress milestones (rewards.yaml) are
checked on the solutions' steps, and the task expectations in
``halo_agent/sites/expectations/omnizon.yaml`` on the /finish JSON each run leaves.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("agisdk")
jmespath = pytest.importorskip("jmespath")
yaml = pytest.importorskip("yaml")

from halo_agent.envs.base import ActionRunner, element_for_action, extract_page_state  # noqa: E402
from halo_agent.rewards import EpisodeRewards, RewardConfig  # noqa: E402
from halo_agent.sites import SITES_DIR, LocalSite  # noqa: E402

VIEWPORT = {"width": 1280, "height": 720}
EXPECTATIONS_FILE = SITES_DIR / "expectations" / "omnizon.yaml"
V2_TASKS = ("omnizon-3", "omnizon-9", "omnizon-13", "omnizon-15", "omnizon-17",
            "omnizon-24", "omnizon-25", "omnizon-28", "omnizon-29", "omnizon-30")


@dataclasses.dataclass(frozen=True)
class Op:
    """One BrowserGym action on the element with this role and accessible name (a str, or a regex)."""

    verb: str  # click | fill | press | select
    role: str
    name: str | re.Pattern
    value: str = ""

    def action(self, bid: str) -> str:
        if self.verb == "click":
            return f"click({bid!r})"
        if self.verb == "fill":
            return f"fill({bid!r}, {self.value!r})"
        if self.verb == "press":
            return f"press({bid!r}, {self.value!r})"
        if self.verb == "select":
            return f"select_option({bid!r}, {self.value!r})"
        raise ValueError(self.verb)


def search(query: str) -> list[Op]:
    return [Op("fill", "searchbox", "Search Omnizon", query), Op("press", "searchbox", "Search Omnizon", "Enter")]


def open_product(name: str) -> list[Op]:
    return [Op("click", "link", name)]


ADD_TO_CART = Op("click", "button", "Add to Cart")
BUY_NOW = Op("click", "button", "Buy Now")
OPEN_CART = Op("click", "link", re.compile(r"^Cart \d+$"))
PROCEED = Op("click", "button", "Proceed to checkout")
PLACE_ORDER = Op("click", "button", "Place your order")


def add_from_results(name: str) -> Op:
    return Op("click", "button", "Add to Cart: " + name)


def quantity(n: int) -> Op:
    return Op("select", "combobox", "Quantity", str(n))


def price_range(low: str, high: str) -> list[Op]:
    ops = [Op("fill", "spinbutton", "Min price", low)] if low else []
    return ops + [Op("fill", "spinbutton", "Max price", high), Op("click", "button", "Go")]


POT = "T-fal Stainless Steel Cooking Pot, 8 Quart Stockpot with Lid"
TEAPOT = "Hiware Glass Teapot with Removable Infuser, 1000ml"
APRON = "HIHIMAN Adjustable Cooking Apron with 2 Pockets, Black"
BALLS = "Sports Balls Pack: Soccer Ball, Basketball, Football and Volleyball (4-Pack) with Pump"
BASKETBALL = "Spalding React TF-250 Indoor-Outdoor Basketball, Size 7"
PILLOW = "Contour Memory Foam Cervical Neck Pillow for Neck Pain Relief"
DUALSENSE = "PlayStation DualSense Wireless Controller for PS5, Midnight Black"
XBOX = "Xbox Core Wireless Gaming Controller, Carbon Black"
PS5 = "PlayStation 5 Console, Slim Disc Edition"
SILVERWARE = "Stainless Steel Silverware Set, 20-Piece Flatware Set for 4"
KNIVES = "Henckels 15-Piece Knife Block Set"
DESK_40 = "SHW 40-Inch Home Office Computer Desk, Espresso"
DESK_55 = "Bestier 55 Inch Gaming Desk with LED Lights and Monitor Shelf"
CHAIR = "Hbada Ergonomic Office Chair with Lumbar Support, Black"
HEADPHONES_90 = "Sony WH-CH720N Noise Canceling Wireless Headphones, Bluetooth Over-Ear"
HEADPHONES_449 = "Apple AirPods Max Wireless Over-Ear Headphones, Space Gray"
BED_QUEEN = "ZINUS Shawn Metal Platform Bed Frame, Queen"

# A correct solution of each task: the last op places the order, so the ops before it are a partial run.
SOLUTIONS: dict[str, list[Op]] = {
    "omnizon-13": [*search("cooking pot"), *open_product(POT), ADD_TO_CART, OPEN_CART, PROCEED, PLACE_ORDER],
    "omnizon-15": [*search("sports balls"), *open_product(BALLS), BUY_NOW, PLACE_ORDER],
    "omnizon-17": [*search("neck pillow"), *open_product(PILLOW), BUY_NOW, PLACE_ORDER],
    "omnizon-24": [*search("ps5 controller"), *open_product(DUALSENSE), quantity(2), BUY_NOW, PLACE_ORDER],
    "omnizon-25": [*search("apron"), add_from_results(APRON), *search("cooking pot"), add_from_results(POT),
                   OPEN_CART, PROCEED, PLACE_ORDER],
    "omnizon-28": [*search("silverware set"), *open_product(SILVERWARE), ADD_TO_CART, OPEN_CART, PROCEED, PLACE_ORDER],
    "omnizon-29": [*search("40 inch desk"), add_from_results(DESK_40), *search("office chair"), add_from_results(CHAIR),
                   OPEN_CART, PROCEED, PLACE_ORDER],
    "omnizon-3": [*search("headphones"), *price_range("24", "100"), *open_product(HEADPHONES_90), BUY_NOW, PLACE_ORDER],
    "omnizon-30": [*search("queen bed frame"), *open_product(BED_QUEEN), BUY_NOW, PLACE_ORDER],
    "omnizon-9": [*search("gaming controller"), *price_range("", "100"), *open_product(XBOX), BUY_NOW, PLACE_ORDER],
}

# A plausible mistake per task, which its eval script must fail.
WRONG: dict[str, list[Op]] = {
    "omnizon-13": [*search("pot"), *open_product(TEAPOT), BUY_NOW, PLACE_ORDER],
    "omnizon-15": [*search("basketball"), *open_product(BASKETBALL), BUY_NOW, PLACE_ORDER],  # one ball, not the pack
    "omnizon-17": [*search("neck pillow"), *open_product(PILLOW), quantity(2), BUY_NOW, PLACE_ORDER],  # two, not one
    "omnizon-24": [*search("ps5 controller"), *open_product(DUALSENSE), BUY_NOW, PLACE_ORDER],  # one, not two
    "omnizon-25": [*search("cooking pot"), *open_product(POT), BUY_NOW, PLACE_ORDER],  # no apron
    "omnizon-28": [*search("knife set"), *open_product(KNIVES), BUY_NOW, PLACE_ORDER],
    "omnizon-29": [*search("gaming desk"), add_from_results(DESK_55), *search("office chair"), add_from_results(CHAIR),
                   OPEN_CART, PROCEED, PLACE_ORDER],  # a 55-inch desk
    "omnizon-3": [*search("headphones"), *open_product(HEADPHONES_449), BUY_NOW, PLACE_ORDER],  # above $100
    "omnizon-30": [*search("bed frame"), *open_product(BED_QUEEN), ADD_TO_CART, OPEN_CART],  # never ordered
    "omnizon-9": [*search("ps5 console"), *open_product(PS5), BUY_NOW, PLACE_ORDER],  # $499, no "gaming" search
}


def expected_milestones(ops: list[Op]) -> set[str]:
    """The Omnizon milestones a run of these ops passes through."""
    reached = {"search_results"}
    if PLACE_ORDER in ops or PROCEED in ops or BUY_NOW in ops:
        reached.add("checkout")
    if any(op.role == "link" and isinstance(op.name, str) for op in ops):
        reached.add("product_page")
    if any(op.verb == "click" and str(op.name).startswith("Add to Cart") for op in ops):
        reached.add("added_to_cart")
    if OPEN_CART in ops:
        reached.add("cart_opened")
    return reached


# ----------------------------------------------------------------------------- fixtures and the driver


@pytest.fixture(scope="module")
def omnizon_site():
    with LocalSite("omnizon") as site:
        yield site


@pytest.fixture(scope="module")
def browser():
    from halo_agent.browser import BrowserSession

    session = BrowserSession()
    yield session
    session.close()


@pytest.fixture(scope="module")
def eval_tmpdir(tmp_path_factory):
    """agisdk writes the /finish JSON to a temp file for the eval script, and eval_omnizon_28.py also
    reads every .json/.txt beside it: give the scripts a folder of their own. agisdk's console
    (the whole state diff per evaluation) goes to logging, as in rollouts."""
    from halo_agent.envs.real import route_agisdk_console_to_logging

    route_agisdk_console_to_logging()
    saved = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("evals"))
    yield Path(tempfile.tempdir)
    tempfile.tempdir = saved


@pytest.fixture(scope="module")
def expectations():
    return yaml.safe_load(EXPECTATIONS_FILE.read_text())


def _element(page_state, op: Op):
    for element in page_state.elements:
        name_ok = op.name.search(element.name) if isinstance(op.name, re.Pattern) else element.name == op.name
        if name_ok and element.role == op.role:
            return element
    offered = [(e.role, e.name) for e in page_state.elements]
    raise AssertionError(f"no {op.role} {op.name!r} on {page_state.url}: {offered}")


@dataclasses.dataclass
class Run:
    finish: dict  # the /finish JSON after the last op
    before: dict[int, dict]  # the state difference before op i, for the i asked for
    milestones: list[list[str]]  # reached at each step
    urls: list[str]  # after each step


def _act(page, runner: ActionRunner, state, op: Op, goal: str):
    element = _element(state, op)
    action = op.action(element.bid)
    assert element_for_action(action, state.elements) == element
    error, _ = runner.run(page, action, state.extra["element_bboxes"])
    if error and "Timeout" in error:
        # BrowserGym gives fill/select 500 ms; on a CPU shared with other work that can pass
        # before Chromium has painted. The same action once more, on a fresh observation.
        state = extract_page_state(page, goal, screenshot=False)
        element = _element(state, op)
        action = op.action(element.bid)
        error, _ = runner.run(page, action, state.extra["element_bboxes"])
    assert error is None, f"{action} on {state.url}: {error}"
    return action, element


@dataclasses.dataclass
class Shop:
    """The shop open in one browser context: the agent's page and agisdk's background page for /config and /finish.

    Episodes share it, as the /config contract allows: /config resets the shop's state (each test
    checks that the shop then reports no difference), so a fresh context per episode, as agisdk's
    environment makes, is not needed to start clean.
    """

    url: str
    page: object
    background: object
    rewards: RewardConfig  # halo_agent/configs/rewards.yaml

    def finish(self) -> dict:
        self.background.goto(f"{self.url}/finish")
        return json.loads(self.background.locator("pre").inner_text())

    def state_diff(self) -> dict:
        """What /finish would say now, from the shop's own page (the same stateDiff, without a navigation)."""
        return self.page.evaluate("() => stateDiff(loadState())")


@pytest.fixture(scope="module")
def shop(browser, omnizon_site):
    page = browser.new_page(VIEWPORT)
    yield Shop(omnizon_site.url, page, page.context.new_page(), RewardConfig.load())
    browser.close_context()


def run_ops(shop: Shop, task: str, ops: list[Op], diff_before: tuple[int, ...] = ()) -> Run:
    """Reset the site for the task as agisdk does (/config in a background page), act, read /finish."""
    shop.background.goto(f"{shop.url}/config?run_id=0&task_id=v2.{task}&latency=0")
    page = shop.page
    page.bring_to_front()
    page.goto(shop.url)
    rewards = EpisodeRewards(shop.rewards, "omnizon", start_url=page.url)
    runner = ActionRunner()
    state = extract_page_state(page, task, screenshot=False)
    run = Run({}, {}, [], [])
    for i, op in enumerate(ops):
        if i in diff_before:
            run.before[i] = shop.state_diff()
        action, element = _act(page, runner, state, op, task)
        after = extract_page_state(page, task, screenshot=False)
        step = rewards.step(state_hash=state.url + state.axtree, action=action, action_valid=True, target=element,
                            url_after=after.url, page_after=after.axtree, state_hash_after=after.url + after.axtree)
        run.milestones.append(step.milestones)
        run.urls.append(after.url)
        state = after
    run.finish = shop.finish()
    return run


def score(task: str, finish: dict) -> float:
    """agisdk's evaluator with the task's own eval script (installed, unchanged)."""
    from agisdk.REAL.browsergym.webclones.evaluate import WebCloneEvaluator
    from agisdk.REAL.browsergym.webclones.task_config import TaskConfig

    config = TaskConfig(task, "v2")
    assert [e.script for e in config.get_evals()] == [f"eval_{task.replace('-', '_')}.py"]
    reward, _done, _message, _info = WebCloneEvaluator(config).evaluate(env_state=finish, model_response="Done.")
    return reward


def holding(checks: list[dict], finish: dict) -> list[bool]:
    """Each check evaluated as agisdk evaluates a jmespath eval: the query's value equals expected_value."""
    out = []
    for check in checks:
        try:
            value = jmespath.search(check["query"], finish)
        except jmespath.exceptions.JMESPathError:
            value = None
        out.append(value == check["expected_value"])
    return out


def orders(finish: dict) -> list[dict]:
    return list(finish["initialfinaldiff"]["added"].get("order", {}).get("orders", {}).values())


# ----------------------------------------------------------------------------- the site itself


def test_the_site_serves_its_pages_and_the_contract():
    """Any path of the shop's own routing is its one page; /config, /finish and the scripts are served as files."""
    import urllib.request

    with LocalSite("omnizon") as site:
        def get(path: str) -> tuple[str, str]:
            with urllib.request.urlopen(site.url + path, timeout=5) as reply:
                return reply.headers["Content-Type"], reply.read().decode()

        home = get("/")
        assert home[0].startswith("text/html") and 'src="/app.js"' in home[1]
        for path in ("/search?q=cooking+pot", "/product/212", "/cart", "/checkout", "/confirmation", "/orders"):
            assert get(path) == home
        assert "freshState(params.get(\"task_id\")" in get("//config?run_id=0&task_id=v2.omnizon-13")[1]
        assert "stateDiff(loadState())" in get("/finish")[1]
        kind, catalog = get("/catalog.js")
        assert kind.startswith("text/javascript")
        # The ids REAL's v2 eval scripts name are in the catalog.
        for product_id in ("16", "91", "114", "159", "167", "170", "192", "193", "212", "215"):
            assert f'product("{product_id}", ' in catalog


def test_expectations_cover_every_v2_omnizon_task_with_valid_queries(expectations):
    from agisdk.REAL.browsergym import webclones

    v2 = sorted(f"v2.{p.stem}" for p in (Path(webclones.__file__).parent / "v2" / "tasks").glob("omnizon-*.json"))
    assert v2 == sorted(f"v2.{t}" for t in V2_TASKS) == sorted(expectations)
    for task, checks in expectations.items():
        assert len(checks) >= 3, task
        for check in checks:
            assert set(check) == {"description", "query", "expected_value"} and check["description"], (task, check)
            jmespath.compile(check["query"])


# ----------------------------------------------------------------------------- all 10 v2 tasks (one Chromium)


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("task", V2_TASKS)
def test_v2_task_scripted_solution_scores_1_wrong_and_partial_0(task, shop, eval_tmpdir, expectations):
    ops = SOLUTIONS[task]
    assert ops[-1] == PLACE_ORDER
    solved = run_ops(shop, task, ops, diff_before=(0, len(ops) - 1))
    untouched, partial = solved.before[0], solved.before[len(ops) - 1]

    # agisdk's evaluator with the task's own script: 1.0 for the solution, 0.0 before the order is placed.
    assert score(task, solved.finish) == 1.0
    assert score(task, partial) == 0.0
    assert score(task, untouched) == 0.0
    assert untouched["initialfinaldiff"] == {"added": {}, "deleted": {}, "updated": {}}
    assert untouched["taskId"] == f"v2.{task}"
    assert solved.urls[-1].endswith("/confirmation")
    placed = orders(solved.finish)
    assert len(placed) == 1 and placed[0]["total"] > 0 and all(isinstance(i["id"], str) for i in placed[0]["items"])

    # The progress milestones fire on the solution's own steps, each once, in the order of the flow.
    reached = [name for step in solved.milestones for name in step]
    assert set(reached) == expected_milestones(ops) and len(reached) == len(set(reached))
    flow = ["search_results", "product_page", "added_to_cart", "cart_opened", "checkout"]
    assert reached == [m for m in flow if m in reached]

    # The task's expectations: all hold on the solution, some but not all on the partial run, none untouched.
    checks = expectations[f"v2.{task}"]
    unmet = [c["description"] for c, ok in zip(checks, holding(checks, solved.finish)) if not ok]
    assert unmet == []
    assert 0 < sum(holding(checks, partial)) < len(checks)
    assert not any(holding(checks, untouched))

    # A plausible mistake: the script fails it, and so does at least one expectation.
    wrong = run_ops(shop, task, WRONG[task])
    assert score(task, wrong.finish) == 0.0
    assert not all(holding(checks, wrong.finish))


# ----------------------------------------------------------------------------- whole episodes through RealEnv


def _episode(env, task: str, ops: list[Op], answer: str):
    """One RealEnv episode of BrowserGym actions, with the Omnizon milestones of each step."""
    page = env.reset(f"v2.{task}", task_seed=0)
    rewards = EpisodeRewards(RewardConfig.load(), page.extra["site"], start_url=page.url)
    reached = []
    for op in ops:
        element = _element(page, op)
        outcome = env.step(op.action(element.bid))
        if outcome.action_error and "Timeout" in outcome.action_error:  # see _act
            outcome = env.step(op.action(element.bid))
        assert outcome.action_error is None and not outcome.terminated and outcome.reward == 0.0, outcome.action_error
        step = rewards.step(state_hash=page.url + page.axtree, action=op.action(element.bid), action_valid=True,
                            target=element, url_after=outcome.page.url, page_after=outcome.page.axtree)
        reached += step.milestones
        page = outcome.page
    final = env.step(f"send_msg_to_user({answer!r})")
    assert final.terminated
    return page, final, reached


@pytest.mark.browser
@pytest.mark.slow
def test_realenv_episodes_are_scored_by_the_v2_eval_scripts(omnizon_site, eval_tmpdir, expectations):
    """v2.omnizon-13 through the cart (every milestone) and v2.omnizon-24 wrong then right, as rollouts run them."""
    from halo_agent.envs.real import RealEnv

    env = RealEnv(site_urls={"omnizon": omnizon_site.url}, screenshot=False)
    try:
        page, final, reached = _episode(env, "omnizon-13", SOLUTIONS["omnizon-13"], "I ordered an 8 quart cooking pot.")
        assert page.url.endswith("/confirmation") and "Order placed, thank you!" in page.axtree
        assert final.reward == 1.0 and final.raw_reward == 1.0
        assert reached == ["search_results", "product_page", "added_to_cart", "cart_opened", "checkout"]
        env_state = final.info["env_state"]
        assert [i["id"] for o in orders(env_state) for i in o["items"]] == ["212"]
        assert all(holding(expectations["v2.omnizon-13"], env_state))

        _, final, _ = _episode(env, "omnizon-24", WRONG["omnizon-24"], "I ordered a PS5 controller.")
        assert final.reward == 0.0  # one controller, not two
        assert [i["quantity"] for o in orders(final.info["env_state"]) for i in o["items"]] == [1]

        # eval_omnizon_28.py also reads the .json/.txt files beside its state file: beside the shared temp folder's
        # other files (here one that names a silverware order) it passes a knife set; RealEnv evaluates in a folder
        # of its own.
        decoy = eval_tmpdir / "other-episode.txt"
        decoy.write_text("order confirmation: stainless steel silverware set with spoons and forks")
        _, final, _ = _episode(env, "omnizon-28", WRONG["omnizon-28"], "I ordered a silverware set.")
        assert final.reward == 0.0
        assert score("omnizon-28", final.info["env_state"]) == 1.0  # what the shared folder scores
        decoy.unlink()
    finally:
        env.close()
