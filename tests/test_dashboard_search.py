"""The dashboard's search-tree page through streamlit.testing's AppTest over a real lake of mcts_nodes."""

from __future__ import annotations

import io

import pytest

from halo_data.lake import Lake
from halo_data.writer import Screenshot, append_rows, screenshots_table
from test_dashboard import open_app, texts
from test_mcts_views import node

pytest.importorskip("streamlit")


def png(color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def tree_lake(tmp_path_factory) -> Lake:
    lake = Lake.init(tmp_path_factory.mktemp("search-page") / "lake")
    shot = Screenshot.from_bytes(png((200, 30, 30)))
    lake.append("screenshots", screenshots_table([shot]))
    rows = [
        node("s1", "t1", "0", visits=5),
        node("s1", "t1", "0.0", action="click('A')", q=0.9, visits=3),
        node("s1", "t1", "0.1", action="click('B')", q=0.2, visits=1),
        node("s1", "t1", "0.2", action="click('Clock')", q=0.0, visits=1, reproducible=False),
        node("s1", "t1", "0.0.0", action="click('C')", q=1.0, visits=2),
    ]
    for r in rows:
        r.update(task_seed=3, url="file:///lock.html", terminal=r["node_id"] == "0.0.0", reward=1.0 if r["node_id"] == "0.0.0" else None,
                 screenshot_hash=shot.hash if r["node_id"] == "0.0.0" else None, q_mcts=r["q"], q_critic=0.5)
    rows[3]["restore_error"] = "state abc where the episode saw def"
    append_rows(lake, "mcts_nodes", rows)
    return lake


def test_tree_page_shows_nodes_best_path_and_the_selected_nodes_page(monkeypatch, tree_lake):
    at = open_app(monkeypatch, tree_lake.root, "search")
    text = texts(at)
    assert "miniwob.code-lock seed 3 (5 nodes, solved)" in at.selectbox(key="search_tree").options[0]
    assert "`click('A')` → `click('C')`" in text
    assert {m.label: m.value for m in at.metric} == {"Nodes": "5", "Root visits": "5", "Unreproducible nodes": "1"}
    table = at.dataframe[0].value
    assert list(table["node"]) == ["0", "  0.0", "  0.1", "  0.2", "    0.0.0"]
    assert list(table["best"]) == [True, True, False, False, True]
    # the best path's last node is selected: its screenshot and prompt are shown
    assert at.selectbox(key="search_node").value == "0.0.0"
    assert len(at.get("image")) == 1
    assert any("[user]\nGoal: Enter the code" in c.value for c in at.code)
    at.selectbox(key="search_node").set_value("0.2").run()
    assert "This node does not reproduce: state abc where the episode saw def" in [w.value for w in at.warning]
    assert "no screenshot stored for this node" in texts(at)


def test_a_lake_without_trees_says_how_to_get_some(monkeypatch, tmp_path):
    Lake.init(str(tmp_path / "lake"))
    at = open_app(monkeypatch, tmp_path / "lake", "search")
    assert "has no search trees yet" in texts(at) and "halo-agent search" in texts(at)
