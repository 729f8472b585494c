"""Search trees (``halo-agent search``, ``halo-train mcts``): one tree's nodes with visits and Q, its best path,
and the screenshot and prompt at a selected node."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboards import data

TREES_SQL = """
SELECT
    run_id, tree_id, any_value(task_id) AS task_id, any_value(task_seed) AS task_seed, count(*) AS nodes,
    bool_or(terminal AND reward > 0 AND reproducible IS NOT false) AS solved,
    count(*) FILTER (WHERE reproducible = false) AS unreproducible
FROM mcts_nodes
GROUP BY run_id, tree_id
ORDER BY run_id, task_id, task_seed, tree_id
"""

NODES_SQL = """
SELECT node_id, parent_id, depth, action, visits, q_mcts, q_critic, q, critic_rank, terminal, reward,
       reproducible, restore_error, logprob_sum, url, screenshot_hash, prompt
FROM mcts_nodes
WHERE run_id = $run AND tree_id = $tree
ORDER BY depth, node_id
"""


def best_path(nodes: pd.DataFrame) -> list[str]:
    """From the root, the most visited reproducible child each time (ties: higher Q), as the search reports it."""
    path = [nodes.loc[nodes["parent_id"].isna(), "node_id"].iloc[0]]
    while True:
        children = nodes[(nodes["parent_id"] == path[-1]) & (nodes["reproducible"] != False) & (nodes["visits"] > 0)]  # noqa: E712
        if children.empty:
            return path
        path.append(children.sort_values(["visits", "q"], ascending=False)["node_id"].iloc[0])


def _label(tree: pd.Series) -> str:
    mark = "solved" if tree["solved"] else "not solved"
    return f"{tree['task_id']} seed {tree['task_seed']} ({tree['nodes']} nodes, {mark})"


st.title("Search trees")
snap = data.current_snapshot()
trees = snap.df(TREES_SQL) if snap is not None else pd.DataFrame()
if snap is not None and trees.empty:
    st.info(f"The lake at {snap.root} has no search trees yet. Search with `halo-agent search --lake {snap.root} ...` "
            "or run `halo-train mcts`; this page updates when they land.")
elif snap is not None:
    run = st.selectbox("Run", sorted(trees["run_id"].unique()), key="search_run")
    in_run = trees[trees["run_id"] == run].reset_index(drop=True)
    pick = st.selectbox("Tree", range(len(in_run)), format_func=lambda i: _label(in_run.iloc[i]), key="search_tree")
    tree = in_run.iloc[pick if pick is not None and pick < len(in_run) else 0]
    nodes = snap.df(NODES_SQL, {"run": run, "tree": tree["tree_id"]})
    best = best_path(nodes)
    c1, c2, c3 = st.columns(3)
    c1.metric("Nodes", f"{len(nodes):,}")
    c2.metric("Root visits", f"{int(nodes.loc[nodes['node_id'] == best[0], 'visits'].iloc[0]):,}")
    c3.metric("Unreproducible nodes", f"{int(tree['unreproducible']):,}")
    by_id = nodes.set_index("node_id")
    st.subheader("Best path")
    st.markdown(" → ".join(f"`{by_id.at[n, 'action']}`" for n in best[1:]) or "(the root has no visited child)")
    st.subheader("Nodes")
    table = nodes.drop(columns=["prompt", "screenshot_hash", "url"]).assign(best=nodes["node_id"].isin(best))
    table.insert(0, "node", ["  " * int(d) + str(n) for d, n in zip(nodes["depth"], nodes["node_id"])])
    st.dataframe(table.drop(columns=["node_id", "parent_id"]), hide_index=True, width="stretch")
    chosen = st.selectbox("Node", list(nodes["node_id"]), index=list(nodes["node_id"]).index(best[-1]), key="search_node")
    node = by_id.loc[chosen]
    st.subheader(f"Node {chosen}")
    st.caption(f"{node['url']} · visits {int(node['visits'])} · Q {node['q']:.3f} (Q_mcts {node['q_mcts']:.3f}, Q_critic {node['q_critic']:.3f})")
    if node["reproducible"] == False:  # noqa: E712 (a numpy bool, or None where unknown)
        st.warning(f"This node does not reproduce: {node['restore_error']}")
    shot = snap.screenshot(node["screenshot_hash"] if isinstance(node["screenshot_hash"], str) else None)
    if shot is None:
        st.caption("no screenshot stored for this node")
    else:
        st.image(shot[0], caption=f"the page at node {chosen}", width="stretch")
    if isinstance(node["prompt"], str):
        for message in json.loads(node["prompt"]):
            st.code(f"[{message['role']}]\n{message['content']}", language=None)
