"""EpisodeWriter: whole episodes per commit, flushes by count and by time, screenshots before steps, dedup."""

from __future__ import annotations

import struct
import time
import zlib

import pytest

from halo_data import ids
from halo_data.lake import Lake, LakeError
from halo_data.writer import EpisodeWriter, Screenshot


def png(width: int, height: int, shade: int = 0) -> bytes:
    """A real PNG (grey, 8-bit) of the given size."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes([shade]) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def episode(attempt: int, run_id: str = "r1", shot: Screenshot | None = None, n_steps: int = 2):
    fields = {"run_id": run_id, "env": "miniwob", "task_id": "miniwob.click-button", "task_seed": 0,
              "attempt_idx": attempt, "success": attempt % 2 == 0}
    steps = [{"url": "http://x/", "prompt": f"[{i}]", "model_output": "noop()",
              "screenshot_hash": shot.hash if shot else None} for i in range(n_steps)]
    return fields, steps, [shot] if shot else []


@pytest.fixture()
def lake(tmp_path):
    return Lake.init(tmp_path / "lake")


def steps_versions(lake: Lake) -> list[int]:
    return [h["version"] for h in lake.table("steps").history() if h.get("operation") == "WRITE"]


def test_flush_by_count_one_steps_commit_per_flush(lake):
    writer = EpisodeWriter(lake, flush_episodes=3, flush_seconds=3600)
    for attempt in range(7):
        writer.write_episode(*episode(attempt))
    assert [len(f.episode_ids) for f in writer.flushes] == [3, 3]
    assert writer.pending_episodes == [ids.episode_id("r1", "miniwob.click-button", 0, 6)]
    assert lake.table("steps").version() == 2
    writer.close()
    assert [f.steps_version for f in writer.flushes] == [1, 2, 3]
    assert sorted(steps_versions(lake)) == [1, 2, 3]
    got = lake.query_arrow("select count(*) as steps, count(distinct episode_id) as episodes from steps").to_pylist()
    assert got == [{"steps": 14, "episodes": 7}]
    # what each flush committed is exactly its episodes
    for f in writer.flushes:
        con = lake.connect(as_of=f.steps_version, views=False)
        n = con.execute("select count(distinct episode_id) from steps").fetchone()[0]
        con.close()
        assert n == sum(len(g.episode_ids) for g in writer.flushes if g.steps_version <= f.steps_version)


def test_flush_by_time(lake):
    writer = EpisodeWriter(lake, flush_episodes=100, flush_seconds=0.3)
    writer.write_episode(*episode(0))
    assert writer.flushes == []
    time.sleep(0.35)
    writer.write_episode(*episode(1))
    assert [len(f.episode_ids) for f in writer.flushes] == [2]
    writer.write_episode(*episode(2))
    assert len(writer.flushes) == 1
    writer.close()
    assert [len(f.episode_ids) for f in writer.flushes] == [2, 1]


def test_context_manager_flushes_at_the_end_and_not_after_an_error(lake):
    with EpisodeWriter(lake, flush_episodes=100) as writer:
        writer.write_episode(*episode(0))
    assert lake.episode_ids("r1") == {ids.episode_id("r1", "miniwob.click-button", 0, 0)}
    with pytest.raises(RuntimeError):
        with EpisodeWriter(lake, flush_episodes=100) as writer:
            writer.write_episode(*episode(1))
            raise RuntimeError("rollout crashed")
    assert len(lake.episode_ids("r1")) == 1


def test_screenshots_are_committed_before_the_steps_that_use_them(lake, monkeypatch):
    order = []
    original = Lake.append

    def recording_append(self, name, data, *a, **kw):
        version = original(self, name, data, *a, **kw)
        order.append((name, version, data.num_rows))
        return version

    monkeypatch.setattr(Lake, "append", recording_append)
    shot = Screenshot.from_bytes(png(3, 2))
    with EpisodeWriter(lake, flush_episodes=100) as writer:
        writer.write_episode(*episode(0, shot=shot))
    assert order == [("screenshots", 1, 1), ("steps", 1, 2)]
    shots_commit = lake.table("screenshots").history(1)[0]["timestamp"]
    steps_commit = lake.table("steps").history(1)[0]["timestamp"]
    assert shots_commit <= steps_commit
    got = lake.query_arrow("select s.step_idx, i.width, i.height, i.format, octet_length(i.image) = $n as same "
                           "from steps s join screenshots i on s.screenshot_hash = i.hash order by 1",
                           {"n": len(png(3, 2))}).to_pylist()
    assert got == [{"step_idx": 0, "width": 3, "height": 2, "format": "png", "same": True},
                   {"step_idx": 1, "width": 3, "height": 2, "format": "png", "same": True}]


def test_screenshot_dedup_within_and_across_writers(lake):
    a, b = Screenshot.from_bytes(png(4, 4, 10)), Screenshot.from_bytes(png(4, 4, 20))
    assert a.hash == ids.image_hash(png(4, 4, 10)) and a.hash != b.hash
    with EpisodeWriter(lake, flush_episodes=2) as writer:
        for attempt in range(4):   # the same image in every episode, over two flushes
            writer.write_episode(*episode(attempt, shot=a))
    assert [f.screenshots for f in writer.flushes] == [1, 0]
    with EpisodeWriter(lake) as second:   # a later writer learns what the lake already holds
        second.write_episode(*episode(0, run_id="r2", shot=a))
        second.write_episode(*episode(1, run_id="r2", shot=b))
    assert [f.screenshots for f in second.flushes] == [1]
    got = lake.query_arrow("select count(*) as rows, count(distinct hash) as distinct_hashes from screenshots_all")
    assert got.to_pylist() == [{"rows": 2, "distinct_hashes": 2}]


def test_write_episode_checks_its_input(lake):
    writer = EpisodeWriter(lake)
    fields, steps, _ = episode(0)
    with pytest.raises(LakeError, match="episode field 'task_id' is required"):
        writer.write_episode({**fields, "task_id": None}, steps)
    with pytest.raises(LakeError, match="has no steps"):
        writer.write_episode(fields, [])
    with pytest.raises(LakeError, match="unknown step field\\(s\\): colour"):
        writer.write_episode(fields, [{"colour": "red"}])
    with pytest.raises(LakeError, match="unknown episode field\\(s\\): colour"):
        writer.write_episode({**fields, "colour": "red"}, steps)
    with pytest.raises(LakeError, match="does not match"):
        writer.write_episode({**fields, "episode_id": "made-up"}, steps)
    writer.write_episode(fields, steps)
    with pytest.raises(LakeError, match="is already buffered"):
        writer.write_episode(fields, steps)
    assert writer.discard() == [ids.episode_id("r1", "miniwob.click-button", 0, 0)]
    writer.close()
    assert lake.table("steps").version() == 0


def test_episode_fields_are_on_every_step(lake):
    with EpisodeWriter(lake) as writer:
        fields, steps, _ = episode(0, n_steps=3)
        writer.write_episode(fields, steps)
    got = lake.query_arrow("select step_idx, is_last, n_steps, success, attempt_idx, state_hash_version, prompt_hash "
                           "from steps order by step_idx").to_pylist()
    assert got == [
        {"step_idx": i, "is_last": i == 2, "n_steps": 3, "success": True, "attempt_idx": 0, "state_hash_version": 1,
         "prompt_hash": ids.sha256_hex(f"[{i}]")}
        for i in range(3)
    ]
