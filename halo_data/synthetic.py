"""Synthetic but realistic episodes, for benchmarks, fixtures and demos.

Episodes look like real rollouts where it matters for cost: tasks on several
sites, several attempts per task with the same task_seed, 20–70 steps, AXTree
text of realistic size and variety, page states shared across attempts (an
attempt revisits the task's known states and finds a new one with probability
``new_state_share``), one screenshot per distinct page state so screenshots
repeat the way real rollouts repeat them, prompts from the real renderer.

    spec = SyntheticSpec(n_steps=100_000, seed=0)
    build_synthetic_lake("bench-lake", spec)          # fast path: big Arrow appends
    for ep in generate_episodes(spec): ...            # per-episode records
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import struct
import zlib
from typing import Iterator

from halo_data import ids, prompts, runs
from halo_data.config import RewardWeights
from halo_data.lake import Lake
from halo_data.records import EpisodeRecord, StepRecord
from halo_data.writer import EpisodeWriter, Screenshot

SITES = {
    "gomail": ["Inbox", "Compose", "Sent", "Drafts", "Starred", "Archive", "Search mail", "Reply", "Forward"],
    "gocalendar": ["Today", "Create event", "Week", "Month", "Save", "Guests", "Title", "Location", "Repeat"],
    "omnizon": ["Search", "Add to cart", "Cart", "Checkout", "Deals", "Orders", "Reviews", "Buy now", "Filters"],
    "miniwob": ["Submit", "OK", "Cancel", "Next", "Yes", "No", "Previous", "Search", "Confirm"],
}
ROLES = ["button", "link", "textbox", "checkbox", "combobox", "menuitem", "tab", "heading", "StaticText", "listitem"]
WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu meeting invoice order shipping "
    "review project budget travel weekly report summary update question thanks tomorrow monday friday"
).split()


@dataclasses.dataclass
class SyntheticSpec:
    n_steps: int = 10_000
    attempts_per_task: int = 8
    min_steps: int = 20
    max_steps: int = 70
    new_state_share: float = 0.3
    axtree_elements: tuple[int, int] = (40, 140)
    screenshots: bool = True
    screenshot_size: tuple[int, int] = (320, 200)
    screenshot_noise_rows: float = 0.25
    run_id: str = "synthetic"
    seed: int = 0


@dataclasses.dataclass
class SyntheticEpisode:
    episode: EpisodeRecord
    steps: list[StepRecord]
    screenshots: list[Screenshot]


def synthetic_png(seed: int, width: int = 320, height: int = 200, noise_rows: float = 0.25) -> bytes:
    """A real PNG whose size behaves like a screenshot's: flat UI areas plus a share of busy rows."""
    rng = random.Random(seed)
    base = bytes(rng.randrange(180, 256) for _ in range(3))
    flat_row = b"\x00" + base * width
    rows = []
    for y in range(height):
        if rng.random() < noise_rows:
            rows.append(b"\x00" + rng.randbytes(width * 3))
        else:
            rows.append(flat_row)
    raw = b"".join(rows)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def _axtree(rng: random.Random, site: str, n: int) -> tuple[str, list[int]]:
    labels = SITES[site]
    lines = [f"RootWebArea '{site.title()}', focused"]
    bids = []
    for i in range(n):
        bid = rng.randrange(10, 999)
        role = rng.choice(ROLES)
        label = rng.choice(labels) if rng.random() < 0.4 else " ".join(rng.choices(WORDS, k=rng.randrange(1, 7)))
        indent = "\t" * rng.randrange(1, 4)
        lines.append(f"{indent}[{bid}] {role} '{label}'")
        if role in ("button", "link", "textbox", "checkbox", "combobox", "menuitem", "tab"):
            bids.append(bid)
    return "\n".join(lines), bids or [1]


class _Task:
    def __init__(self, rng: random.Random, idx: int, spec: SyntheticSpec):
        self.site = list(SITES)[idx % len(SITES)]
        self.task_id = f"{'miniwob' if self.site == 'miniwob' else 'v2'}.{self.site}-{idx}"
        self.goal = f"On {self.site}, " + " ".join(rng.choices(WORDS, k=rng.randrange(6, 16)))
        self.url = f"http://{self.site}.local/" if self.site != "miniwob" else f"file:///miniwob/{idx}.html"
        # (url, axtree, bids, screenshot hash, state_hash); state_hash is computed once per state
        # because revisits are most steps and hashing the AXTree dominates generation time.
        self.states: list[tuple[str, str, list[int], str | None, str]] = []
        self.spec = spec

    def new_state(self, rng: random.Random, shots: dict[str, Screenshot]) -> tuple[str, str, list[int], str | None, str]:
        lo, hi = self.spec.axtree_elements
        axtree, bids = _axtree(rng, self.site, rng.randrange(lo, hi))
        url = self.url + rng.choice(["", "compose", "search?q=" + rng.choice(WORDS), "item/" + str(rng.randrange(999))])
        shot_hash = None
        if self.spec.screenshots:
            w, h = self.spec.screenshot_size
            png = synthetic_png(rng.randrange(2**62), w, h, self.spec.screenshot_noise_rows)
            shot = Screenshot.from_bytes(png, "png", w, h)
            shots[shot.hash] = shot
            shot_hash = shot.hash
        state = (url, axtree, bids, shot_hash, ids.state_hash(url, axtree))
        self.states.append(state)
        return state


def generate_episodes(spec: SyntheticSpec) -> Iterator[SyntheticEpisode]:
    """Episodes until ``spec.n_steps`` steps have been produced (the last episode may be cut short)."""
    rng = random.Random(spec.seed)
    weights = RewardWeights()
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    produced = 0
    task_idx = 0
    while produced < spec.n_steps:
        task = _Task(rng, task_idx, spec)
        task_seed = rng.randrange(1000)
        for attempt in range(spec.attempts_per_task):
            if produced >= spec.n_steps:
                return
            shots: dict[str, Screenshot] = {}
            n = min(rng.randrange(spec.min_steps, spec.max_steps + 1), spec.n_steps - produced)
            success = rng.random() < 0.35
            started = t0 + dt.timedelta(seconds=produced)
            episode = EpisodeRecord(
                run_id=spec.run_id,
                env="miniwob" if task.site == "miniwob" else "real",
                task_id=task.task_id,
                site=task.site,
                task_version=None if task.site == "miniwob" else "v2",
                split="train",
                mode="random",
                policy="random",
                policy_version="v0",
                attempt_idx=attempt,
                seed=spec.seed,
                task_seed=task_seed,
                temperature=1.0,
                success=success,
                task_reward=1.0 if success else 0.0,
                raw_reward=1.0 if success else rng.choice([0.0, -1.0]),
                n_steps=n,
                terminated=success,
                truncated=not success,
                started_at=started,
                ended_at=started + dt.timedelta(seconds=n),
            )
            steps = []
            history: list[str] = []
            progress = 0.0
            seen: set[str] = set()
            for i in range(n):
                if task.states and (i == 0 or rng.random() >= spec.new_state_share):
                    # Attempts share the start state; later they revisit known states.
                    state = task.states[0] if i == 0 else rng.choice(task.states)
                else:
                    state = task.new_state(rng, shots)
                url, axtree, bids, shot_hash, shash = state
                action = f"click('{rng.choice(bids)}')" if rng.random() < 0.8 else f"fill('{rng.choice(bids)}', '{rng.choice(WORDS)}')"
                messages = prompts.render_messages(task.goal, url, axtree, history, screenshot_hash=shot_hash)
                prompt = prompts.dumps(messages)
                r_progress = round(rng.random() * 0.1, 4) if rng.random() < 0.3 else 0.0
                progress = min(1.0, progress + r_progress)
                components = {
                    "progress": r_progress,
                    "novelty": 1.0 if shash not in seen else 0.0,
                    "loop": -1.0 if shash in seen and rng.random() < 0.3 else 0.0,
                    "validity": 1.0,
                    "success": (1.0 if success else 0.0) if i == n - 1 else 0.0,
                }
                seen.add(shash)
                steps.append(
                    StepRecord(
                        step_idx=i,
                        url=url,
                        goal=task.goal,
                        observation=axtree,
                        screenshot_hash=shot_hash,
                        prompt=prompt,
                        model_output=action,
                        action=action,
                        action_source="random",
                        action_valid=True,
                        rewards=components,
                        weights=weights,
                        cumulative_progress=1.0 if (success and i == n - 1) else progress,
                        state_hash=shash,
                        latency_ms=0.0,
                        env_ms=25.0,
                    )
                )
                history.append(action)
            produced += n
            yield SyntheticEpisode(episode, steps, list(shots.values()))
        task_idx += 1


def bulk_writer(lake: Lake, spec: SyntheticSpec, batch_steps: int = 50_000) -> EpisodeWriter:
    """An EpisodeWriter committing about ``batch_steps`` steps at a time: the bulk path for generated data."""
    mean_steps = max(1, (spec.min_steps + spec.max_steps) // 2)
    # A fresh data set: nothing to deduplicate against, so the writer need not read the lake's hashes.
    return EpisodeWriter(lake, flush_episodes=max(1, batch_steps // mean_steps), flush_seconds=float("inf"), known_screenshots=())


def build_synthetic_lake(root: str, spec: SyntheticSpec, batch_steps: int = 50_000, progress: bool = False) -> Lake:
    """Write ``spec``'s episodes into a lake at ``root`` in large commits (the bulk path, not a rollout)."""
    lake = Lake.init(root)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=spec.n_steps, unit="step", desc="synthetic lake")
    with bulk_writer(lake, spec, batch_steps) as writer:
        for ep in generate_episodes(spec):
            writer.write_episode(ep.episode, ep.steps, ep.screenshots)
            if bar:
                bar.update(len(ep.steps))
    if bar:
        bar.close()
    lake.upsert_runs([synthetic_run_row(spec, "halo_data.synthetic.build_synthetic_lake")])
    return lake


def synthetic_run_row(spec: SyntheticSpec, command: str, planned_episodes: int | None = None, **provenance: str) -> dict:
    """The ``runs`` row of a synthetic data set."""
    now = runs.utc_now()
    return runs.RunRecord(
        run_id=spec.run_id,
        kind="rollout",
        mode="random",
        env="mixed",
        policy="random",
        policy_version="v0",
        split="train",
        config=dataclasses.asdict(spec),
        command=command,
        planned_episodes=planned_episodes,
        status="finished",
        started_at=now,
        ended_at=now,
        provenance=runs.provenance(generator="halo_data.synthetic", **provenance),
    ).row()
