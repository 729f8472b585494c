"""One search tree over one task instance: selection, expansion, simulation, backup (Agent Q, arXiv 2408.07199).

Every simulation:

1. **Selection** descends from the root by UCB1 on Q = alpha * Q_mcts + (1 - alpha) * Q_critic
   to a node not yet tried (or a tried leaf, which is then expanded).
2. **Expansion** asks the policy for K actions in one call (n = K) at that node's page; the
   critic ranks them (``critics``), each rank becoming the child's Q_critic.
3. The child UCB1 prefers is **reached**: its parent's state is restored by replaying the
   action prefix from a reset with the same task seed, every state hash checked
   (``halo_agent.restore``), and the child's action executed there.
4. **Simulation**: the rollout policy acts from the child to a terminal state or the depth limit.
5. **Backup**: the environment's reward (plus the dense progress reached, with
   ``backup="progress"``) is added to every node from the child to the root.

A node whose prefix does not replay to its recorded states is flagged
(``reproducible = False``, ``restore_error``): selection skips it and everything below
it, and ``mcts_pairs`` never pairs it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from halo_data import ids, prompts
from halo_data.writer import Screenshot

from halo_agent.envs.base import PageState, StepOutcome, TaskSpec, element_for_action
from halo_agent.restore import Restored, StatePath, error_line, restore_state
from halo_agent.rewards import EpisodeRewards, RewardConfig, task_share
from halo_agent.rollout.episode import build_observation
from halo_agent.search.config import SearchConfig
from halo_agent.search.critics import PROGRESS, Critic
from halo_agent.search.tree import FRUITLESS_EXPANSIONS, Node, Tree, ucb
from halo_agent.types import PolicyOutput

log = logging.getLogger(__name__)


class CountingEnv:
    """An environment that counts its resets and steps (the search's budget is in environment steps)."""

    def __init__(self, env):
        self.env = env
        self.steps = 0
        self.resets = 0

    def reset(self, task: TaskSpec, task_seed: int) -> PageState:
        self.resets += 1
        return self.env.reset(task, task_seed)

    def step(self, action: str) -> StepOutcome:
        self.steps += 1
        return self.env.step(action)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


@dataclasses.dataclass
class SearchResult:
    tree: Tree
    simulations: int
    env_steps: int
    resets: int
    screenshots: dict[str, Screenshot]

    @property
    def solved(self) -> bool:
        return self.tree.solved() is not None


def tree_id_for(run_id: str, task_id: str, task_seed: int) -> str:
    return ids.sha256_hex(f"mcts|{run_id}|{task_id}|{int(task_seed)}")[:24]


def _seed(*parts: Any) -> int:
    return int(ids.sha256_hex("|".join(str(p) for p in parts))[:8], 16)


class TreeSearch:
    """Searches task instances with one environment, an expansion policy (n = K), a rollout policy and a critic."""

    def __init__(self, env, policy, rollout_policy, critic: Critic, config: SearchConfig, reward_config: RewardConfig):
        self.env = CountingEnv(env) if env is not None else None
        self.policy = policy
        self.rollout_policy = rollout_policy
        self.critic = critic
        self.cfg = config
        self.rewards = reward_config
        self.task: TaskSpec | None = None
        self.task_seed = 0
        self.shots: dict[str, Screenshot] = {}

    def use_env(self, env) -> None:
        self.env = CountingEnv(env)

    # ------------------------------------------------------------------------------ the loop
    def search(self, task: TaskSpec, task_seed: int, tree_id: str) -> SearchResult:
        self.env.steps = self.env.resets = 0
        self.task, self.task_seed, self.shots = task, int(task_seed), {}
        root = Node(node_id="0", parent=None, depth=0)
        self._arrive(root, self.env.reset(task, self.task_seed))
        tree = Tree(tree_id, task.task_id, self.task_seed, root, int(self.cfg.max_depth), int(self.cfg.expansions), float(self.cfg.widen))
        done = 0
        for done in range(1, int(self.cfg.simulations) + 1):
            if not self._simulate(tree, done):
                done -= 1
                break
            if self._spent() or (self.cfg.stop_on_success and tree.solved() is not None):
                break
        log.info("tree %s (%s seed %d): %d simulations, %d env steps, solved=%s", tree_id, task.task_id, task_seed, done, self.env.steps, tree.solved() is not None)
        return SearchResult(tree, done, self.env.steps, self.env.resets, self.shots)

    def _spent(self) -> bool:
        return self.cfg.max_env_steps is not None and self.env.steps >= int(self.cfg.max_env_steps)

    def _simulate(self, tree: Tree, simulation: int) -> bool:
        """One simulation; False when the tree has nothing left to try."""
        leaf = tree.select(float(self.cfg.c_exp), float(self.cfg.alpha))
        if leaf is None:
            return False
        if leaf.reached:
            at = self._restore(leaf)
            if at is None:
                return True
            self._expand(tree, leaf, at.page, simulation)
            if self.cfg.stop_on_success and tree.solved() is not None:
                return True
            choices = [c for c in leaf.children if tree.open(c)]
            if not choices:
                return True
            fresh = [c for c in choices if c.visits == 0]  # a widened node tries what it just drew first
            choices = fresh or choices
            leaf = max(choices, key=lambda c: ucb(c, leaf.visits, float(self.cfg.c_exp), float(self.cfg.alpha)))
            # the progress critic ran every candidate, so the page has moved on; an AI critic left it alone
            at = at if self.critic.name != PROGRESS else None
        else:
            at = None
        at = self._reach(leaf, at)
        if at is None:
            return True
        value = float(leaf.reward or 0.0) if leaf.terminal else self._rollout(leaf, at, simulation)
        if self.cfg.backup == "progress" and at.rewards is not None:
            value += at.rewards.cumulative_progress
        tree.backup(leaf, value)
        return True

    # ------------------------------------------------------------------------------ the parts
    def _arrive(self, node: Node, page: PageState) -> None:
        """Record the page ``node`` leads to: its state hash, and the prompt and screenshot a policy sees there."""
        node.state_hash = ids.state_hash(page.url, page.axtree)
        node.goal, node.url = page.goal, page.url
        shot = Screenshot.from_bytes(page.screenshot) if page.screenshot else None
        if shot is not None:
            self.shots.setdefault(shot.hash, shot)
        node.screenshot_hash = shot.hash if shot is not None else None
        obs = self._observation(node, page, self.policy)
        node.prompt = prompts.dumps(obs.messages)

    def _observation(self, node: Node, page: PageState, policy):
        history = [a for a in node.prefix() if a]
        use_screenshot = bool(getattr(policy, "uses_screenshot", False))
        return build_observation(page, self.task.task_id, history, node.depth, use_screenshot, node.screenshot_hash)

    def _path(self, node: Node) -> StatePath:
        nodes = node.path()
        return StatePath(self.task, self.task_seed, node.prefix(), tuple(n.state_hash for n in nodes), goal=nodes[0].goal)

    def _restore(self, node: Node) -> Restored | None:
        """``node``'s state, restored and verified; None (a node flagged) when it does not reproduce."""
        result = restore_state(self.env, self._path(node), self.rewards)
        if isinstance(result, Restored):
            return result
        nodes = node.path()
        culprit = nodes[min(result.diverged_at, len(nodes) - 1)]
        self._flag(culprit, result.reason)
        return None

    def _flag(self, node: Node, reason: str) -> None:
        """``node`` does not reproduce, and so nothing under it does: none of them is searched or paired again."""
        log.info("node %s does not reproduce: %s", node.node_id, reason)
        node.reproducible, node.restore_error = False, reason
        stack = list(node.children)
        while stack:
            below = stack.pop()
            if below.reproducible:
                below.reproducible, below.restore_error = False, f"node {node.node_id} above it does not reproduce"
            stack.extend(below.children)

    def _reach(self, child: Node, parent_at: Restored | None = None) -> Restored | None:
        """Execute ``child``'s action from its parent's state (``parent_at``, else restored); the first time, record where it led."""
        if child.reached:
            return self._restore(child)
        at = parent_at or self._restore(child.parent)
        if at is None:
            return None
        if child.action is None:  # an output that did not parse: nothing to execute, nothing further
            child.state_hash, child.terminal, child.reward = child.parent.state_hash, True, 0.0
            return at
        try:
            outcome = self.env.step(child.action)
        except Exception as e:  # the environment failed, not the action: nothing learnt about the child
            self._flag(child, f"environment error running {child.action!r}: {error_line(e)}")
            return None
        self._track(at, at.page, child.action, outcome)
        self._land(child, outcome)
        return Restored(outcome.page, child.state_hash, at.rewards)

    def _land(self, child: Node, outcome: StepOutcome) -> None:
        """Record where ``child``'s action led: the page, and whether it ended the task with what reward."""
        self._arrive(child, outcome.page)
        child.action_error = outcome.action_error
        child.terminal = bool(outcome.terminated or outcome.truncated)
        child.reward = float(outcome.reward) if child.terminal else None

    def _track(self, at: Restored, page: PageState, action: str, outcome: StepOutcome) -> None:
        if at.rewards is None:
            return
        after = ids.state_hash(outcome.page.url, outcome.page.axtree)
        at.rewards.step(
            state_hash=ids.state_hash(page.url, page.axtree), action=action, action_valid=outcome.action_error is None,
            action_error=outcome.action_error, target=element_for_action(action, page.elements),
            url_after=outcome.page.url, page_after=outcome.page.axtree, state_hash_after=after, env_reward=float(outcome.reward),
            task_share=task_share(outcome.info),
        )

    def _expand(self, tree: Tree, node: Node, page: PageState, simulation: int) -> None:
        """K candidates from one policy call at ``node``, ranked by the critic, become its children.

        Where the critic executed the candidates (``progress``), each child is recorded where it led,
        and a terminal one is backed up with its reward: those steps are not taken twice.
        """
        self.policy.reset(_seed(self.cfg.seed, self.task.task_id, self.task_seed, node.node_id, simulation))
        obs = self._observation(node, page, self.policy)
        first = self.policy.act(obs)
        if first.api_error:
            log.warning("the policy failed at node %s: %s", node.node_id, first.api_error)
            node.fruitless = FRUITLESS_EXPANSIONS  # an endpoint that fails will not do better on the next call
            return
        tried = {c.action for c in node.children}
        samples = [s for s in _distinct(list(getattr(self.policy, "last_samples", None) or [first])) if s.action not in tried]
        node.fruitless = 0 if samples else node.fruitless + 1
        if not samples:
            return
        ranking = self.critic.rank(self.env, self._path(node), page, obs.history, samples)
        if ranking.unreproducible is not None:
            self._flag(node, ranking.unreproducible.reason)
            return
        outcomes = ranking.outcomes or (None,) * len(samples)
        for sample, rank, value, outcome in zip(samples, ranking.ranks, ranking.values, outcomes):
            child = node.add_child(sample.action, model_output=sample.model_output, logprob_sum=sample.logprob_sum,
                                   critic_rank=rank, q_critic=value, tokens=_tokens(sample, self.policy))
            if outcome is not None:
                self._land(child, outcome)
                if child.terminal:
                    tree.backup(child, child.reward)

    def _rollout(self, node: Node, at: Restored, simulation: int) -> float:
        """The rollout policy from ``node``'s page to a terminal state or the depth limit; the reward it ended with."""
        page, history = at.page, [a for a in node.prefix() if a]
        self.rollout_policy.reset(_seed(self.cfg.seed, self.task.task_id, self.task_seed, node.node_id, simulation, "rollout"))
        use_screenshot = bool(getattr(self.rollout_policy, "uses_screenshot", False))
        for depth in range(node.depth, int(self.cfg.max_depth)):
            obs = build_observation(page, self.task.task_id, history, depth, use_screenshot, None)
            action = self.rollout_policy.act(obs).action
            if action is None:
                return 0.0
            try:
                outcome = self.env.step(action)
            except Exception as e:  # a failed simulation says nothing about the node: it scores nothing
                log.warning("simulation from %s stopped: %s", node.node_id, error_line(e))
                return 0.0
            self._track(at, page, action, outcome)
            if outcome.terminated or outcome.truncated:
                return float(outcome.reward)
            page, history = outcome.page, history + [action]
        return 0.0


def _distinct(samples: list[PolicyOutput]) -> list[PolicyOutput]:
    """One sample per distinct action (the first drawn): a repeated action is the same child."""
    seen: set[str | None] = set()
    out = []
    for s in samples:
        key = s.action if s.action is not None else None
        if key in seen:
            continue
        seen.add(key)
        out.append(s)
    return out


def _tokens(sample, policy) -> dict[str, Any]:
    """A sample's tokens and the distribution of their logprobs, as ``mcts_nodes`` stores them."""
    return dict(completion_token_ids=sample.completion_token_ids, logprobs=sample.logprobs, logprobs_mode=sample.logprobs_mode,
                draw=sample.draw, choices=sample.choices, temperature=getattr(policy, "temperature", None))
