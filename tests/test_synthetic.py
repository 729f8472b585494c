from __future__ import annotations

from halo_data.synthetic import SyntheticSpec, generate_episodes, synthetic_png


def test_generate_episodes_reaches_the_requested_steps_and_shares_states():
    spec = SyntheticSpec(n_steps=500, attempts_per_task=4, min_steps=20, max_steps=30, screenshot_size=(32, 16), seed=3)
    episodes = list(generate_episodes(spec))
    assert sum(len(e.steps) for e in episodes) == 500
    first = episodes[:4]
    # Attempts of one task share their task_seed and start from the same page state.
    assert len({e.episode.task_seed for e in first}) == 1
    assert len({e.steps[0].state_hash for e in first}) == 1
    states = [s.state_hash for e in episodes for s in e.steps]
    new_share = len(set(states)) / len(states)
    assert 0.15 < new_share < 0.45
    # One screenshot per distinct state: never more images than states.
    assert sum(len(e.screenshots) for e in episodes) == len({s.screenshot_hash for e in episodes for s in e.steps})


def test_synthetic_png_is_a_valid_png_of_the_requested_size():
    import io

    from PIL import Image

    png = synthetic_png(1, 40, 30)
    img = Image.open(io.BytesIO(png))
    img.load()
    assert img.size == (40, 30)
    assert synthetic_png(1, 40, 30) == png


def test_synthetic_lake_feeds_every_view(synthetic_lake):
    con = synthetic_lake.connect()
    counts = {v: con.sql(f"select count(*) from {v}").fetchall()[0][0] for v in ("episodes", "bc_rows", "dpo_pairs", "grpo_groups", "reward_stats", "eval_matrix")}
    assert all(n > 0 for n in counts.values()), counts
    assert con.sql("select count(*) from steps").fetchall()[0][0] == 600
    dup = con.sql("select count(*) - count(distinct hash) from screenshots").fetchall()[0][0]
    assert dup == 0
