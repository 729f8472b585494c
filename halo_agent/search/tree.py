"""A search tree: nodes with visits and values, UCB1 selection on the blended value, backup, rows of ``mcts_nodes``.

Node ids are the path of child indices from the root (``0``, ``0.2``, ``0.2.1``): the
same search gives the same ids, and a node's id says where it sits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

from halo_data import ids

# Expansions in a row that find no new action before a node is given up as a dead end.
FRUITLESS_EXPANSIONS = 3


@dataclasses.dataclass
class Node:
    """One state of the tree, reached from its parent by ``action``.

    ``state_hash`` is None until the action has been executed (the node is *reached*);
    ``reproducible`` turns False when a later replay of its prefix did not give the
    recorded state again: the node and everything under it are left alone from then on.
    """

    node_id: str
    parent: "Node | None"
    depth: int
    action: str | None = None
    model_output: str | None = None
    logprob_sum: float | None = None
    # the sample's tokens and the distribution of their logprobs (halo_data.schema.TOKEN_COLUMNS), where known
    tokens: dict[str, Any] = dataclasses.field(default_factory=dict)
    critic_rank: int | None = None
    q_critic: float = 0.0
    visits: int = 0
    value_sum: float = 0.0
    state_hash: str | None = None
    goal: str | None = None
    url: str | None = None
    prompt: str | None = None
    screenshot_hash: str | None = None
    terminal: bool = False
    reward: float | None = None
    action_error: str | None = None
    reproducible: bool = True
    restore_error: str | None = None
    fruitless: int = 0  # expansions in a row that offered no action not tried already
    children: list["Node"] = dataclasses.field(default_factory=list)

    @property
    def reached(self) -> bool:
        return self.state_hash is not None

    @property
    def dead_end(self) -> bool:
        """The policy, asked again and again, offers nothing new here (one unlucky draw is not enough to say so)."""
        return self.fruitless >= FRUITLESS_EXPANSIONS

    @property
    def expanded(self) -> bool:
        return bool(self.children)

    @property
    def q_mcts(self) -> float:
        return self.value_sum / self.visits if self.visits else 0.0

    def q(self, alpha: float) -> float:
        """The blended value Q = alpha * Q_mcts + (1 - alpha) * Q_critic (Agent Q)."""
        return alpha * self.q_mcts + (1.0 - alpha) * self.q_critic

    def path(self) -> list["Node"]:
        """The nodes from the root to this one."""
        out, node = [], self
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]

    def prefix(self) -> tuple[str | None, ...]:
        """The actions from the root that lead here."""
        return tuple(n.action for n in self.path()[1:])

    def add_child(self, action: str | None, **fields: Any) -> "Node":
        child = Node(node_id=f"{self.node_id}.{len(self.children)}", parent=self, depth=self.depth + 1, action=action, **fields)
        self.children.append(child)
        return child


def ucb(child: Node, parent_visits: int, c: float, alpha: float) -> float:
    """UCB1 on the blended value; an unvisited child's exploration term is the largest its parent can give."""
    return child.q(alpha) + c * math.sqrt(math.log(max(parent_visits, 1) + 1) / (child.visits + 1))


@dataclasses.dataclass
class Tree:
    tree_id: str
    task_id: str
    task_seed: int
    root: Node
    max_depth: int
    expansions: int = 1  # K
    widen: float = 0.0  # progressive widening: up to ceil(K * (visits + 1) ** widen) children (0: off)

    def nodes(self) -> Iterator[Node]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def open(self, node: Node) -> bool:
        """Can a simulation still go through ``node``: reproducible, not terminal, and something left below it."""
        if not node.reproducible or node.terminal:
            return False
        if not node.expanded:
            return not node.dead_end and (node.depth < self.max_depth or not node.reached)
        # with every child closed the node is expanded again (new samples), until an expansion finds nothing new
        return not node.dead_end or any(self.open(child) for child in node.children)

    def select(self, c: float, alpha: float) -> Node | None:
        """Descend by UCB1 through expanded nodes to a node to simulate from; None when the tree is exhausted."""
        node = self.root
        if not self.open(node):
            return None
        while node.expanded:
            choices = [child for child in node.children if self.open(child)]
            if not choices or self.wants_more(node):
                return node  # everything tried below it is closed, or it has been visited enough for more: widen it
            node = max(choices, key=lambda child: ucb(child, node.visits, c, alpha))
            if not node.reached:
                return node
        return node

    def wants_more(self, node: Node) -> bool:
        """Progressive widening: has ``node`` been visited often enough for K more candidates?"""
        if self.widen <= 0 or node.dead_end or node.depth >= self.max_depth:
            return False
        return len(node.children) < math.ceil(self.expansions * (node.visits + 1) ** self.widen)

    def backup(self, node: Node, value: float) -> None:
        """Add ``value`` to every node from ``node`` up to the root."""
        for n in node.path():
            n.visits += 1
            n.value_sum += value

    def best_path(self, alpha: float = 1.0) -> list[Node]:
        """From the root, the most visited reproducible child each time (ties: higher Q)."""
        out = [self.root]
        node = self.root
        while node.children:
            options = [c for c in node.children if c.reproducible and c.visits > 0]
            if not options:
                break
            node = max(options, key=lambda c: (c.visits, c.q(alpha)))
            out.append(node)
        return out

    def solved(self) -> Node | None:
        """A reached terminal node with a positive reward (the shallowest), or None."""
        wins = [n for n in self.nodes() if n.terminal and n.reproducible and (n.reward or 0) > 0]
        return min(wins, key=lambda n: (n.depth, n.node_id)) if wins else None

    def rows(self, *, run_id: str, env: str, alpha: float, created_at) -> list[dict[str, Any]]:
        """Rows of ``mcts_nodes``, one per node."""
        return [
            dict(
                run_id=run_id, env=env, tree_id=self.tree_id, node_id=n.node_id,
                parent_id=n.parent.node_id if n.parent is not None else None, task_id=self.task_id, task_seed=self.task_seed,
                depth=n.depth, action=n.action, model_output=n.model_output, logprob_sum=n.logprob_sum,
                critic_rank=n.critic_rank, visits=n.visits, q_mcts=n.q_mcts, q_critic=n.q_critic, q=n.q(alpha),
                state_hash=n.state_hash, replay_prefix=[a or "" for a in n.prefix()], terminal=n.terminal, reward=n.reward,
                goal=n.goal, url=n.url, prompt=n.prompt, prompt_hash=ids.sha256_hex(n.prompt) if n.prompt is not None else None,
                screenshot_hash=n.screenshot_hash, action_error=n.action_error, reproducible=n.reproducible,
                restore_error=n.restore_error, created_at=created_at, **n.tokens,
            )
            for n in self.nodes()
        ]
