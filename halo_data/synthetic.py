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
import itertools
import json
import random
import struct
import zlib
from typing import Iterator

import pyarrow as pa

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


# ---------------------------------------------------------------------- online campaigns
@dataclasses.dataclass
class CampaignSpec:
    """A lake as an online campaign grows it: one run per iteration, each on the same several tasks.

    Screenshots are kept on ``screenshot_share`` of the steps (online rollouts of text policies store few),
    and ``candidate_share`` of the steps carry ``candidates_per_state`` scored candidates (per-state groups).
    Each run is committed in ``commits_per_run`` appends, as a sampler flushing every few episodes commits it.
    """

    run_steps: int = 5_000
    attempts_per_task: int = 8
    screenshot_share: float = 0.01
    candidate_share: float = 0.05
    candidates_per_state: int = 4
    commits_per_run: int = 2
    templates: int = 3
    run_prefix: str = "iter"
    seed: int = 0


CAMPAIGN_SHOT_SIZE = (320, 200)


@dataclasses.dataclass
class _RunTemplate:
    steps: pa.Table
    candidates: pa.Table
    images: dict[str, bytes]  # screenshot hash in ``steps`` -> PNG bytes


def _png_with_text(png: bytes, text: str) -> bytes:
    """``png`` with a tEXt chunk before IEND: a valid, distinct image (its own hash) at no encoding cost."""
    data = b"halo\x00" + text.encode()
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data) & 0xFFFFFFFF)
    return png[:-12] + chunk + png[-12:]


def _run_template(spec: CampaignSpec, index: int) -> _RunTemplate:
    from halo_data import schema as S
    from halo_data.lake import conform

    rng = random.Random(spec.seed * 1000 + index)
    synth = SyntheticSpec(n_steps=spec.run_steps, attempts_per_task=spec.attempts_per_task, screenshots=False,
                          run_id="template", seed=spec.seed * 1000 + index)
    # a writer that never flushes: only its column buffers are used
    writer = EpisodeWriter(None, flush_episodes=1 << 30, flush_seconds=float("inf"), known_screenshots=())  # type: ignore[arg-type]
    for ep in generate_episodes(synth):
        writer.write_episode(ep.episode, ep.steps)
    steps = writer.steps_table()
    n = steps.num_rows
    # screenshots on a share of the steps, one image each
    with_shot = [rng.random() < spec.screenshot_share for _ in range(n)]
    base = synthetic_png(rng.randrange(2**62), *CAMPAIGN_SHOT_SIZE, noise_rows=0.1)
    images = {}
    hashes = []
    for i, keep in enumerate(with_shot):
        if keep:
            png = _png_with_text(base, f"template {index} step {i}")
            h = ids.image_hash(png)
            images[h] = png
            hashes.append(h)
        else:
            hashes.append(None)
    steps = steps.set_column(steps.schema.get_field_index("screenshot_hash"), "screenshot_hash", pa.array(hashes, pa.string()))
    # candidates at a share of the steps: the step's prompt, candidates_per_state sampled actions, scored
    rows = []
    cols = steps.select(["env", "episode_id", "task_id", "step_idx", "state_hash", "prompt", "prompt_hash", "started_at"]).to_pylist()
    for r in cols:
        if rng.random() >= spec.candidate_share:
            continue
        for k in range(spec.candidates_per_state):
            action = f"click('{rng.randrange(10, 999)}')"
            rows.append({**{c: r[c] for c in ("env", "episode_id", "task_id", "step_idx", "state_hash", "prompt", "prompt_hash")},
                         "run_id": "template", "candidate_idx": k, "model_output": action, "action": action,
                         "score": round(rng.random(), 3), "score_source": "env", "logprob_sum": -rng.random() * 5,
                         "created_at": r["started_at"], "temperature": 1.0})
    candidates = conform(pa.Table.from_pylist(rows), S.CANDIDATES) if rows else S.CANDIDATES.schema.empty_table()
    return _RunTemplate(steps, candidates, images)


class CampaignGenerator:
    """Runs of a campaign, each a re-keyed copy of one of a few generated templates (new run id, episode ids,
    policy version, times and screenshots), so appending a run costs its commit, not its generation."""

    def __init__(self, spec: CampaignSpec):
        self.spec = spec
        self._templates = [_run_template(spec, i) for i in range(max(1, spec.templates))]

    def run_id(self, iteration: int) -> str:
        return f"{self.spec.run_prefix}-{iteration:05d}"

    def tables(self, iteration: int, run_id: str | None = None) -> tuple[pa.Table, pa.Table, list[Screenshot]]:
        """(steps, candidates, screenshots) of iteration ``iteration``'s run."""
        import pyarrow.compute as pc

        run_id = run_id or self.run_id(iteration)
        t = self._templates[iteration % len(self._templates)]
        shift = dt.timedelta(hours=iteration)
        steps = t.steps
        # episode ids as the sampler derives them, from the new run id
        first = pc.equal(steps["step_idx"], 0)
        heads = steps.filter(first).select(["episode_id", "task_id", "task_seed", "attempt_idx"]).to_pylist()
        old_ids = [h["episode_id"] for h in heads]
        new_ids = [ids.episode_id(run_id, h["task_id"], h["task_seed"], h["attempt_idx"]) for h in heads]

        def rekey(table: pa.Table) -> pa.Table:
            pos = pc.index_in(table["episode_id"], value_set=pa.array(old_ids))
            table = table.set_column(table.schema.get_field_index("episode_id"), "episode_id", pc.take(pa.array(new_ids), pos))
            table = table.set_column(table.schema.get_field_index("run_id"), "run_id", pa.array([run_id] * table.num_rows, pa.string()))
            return table.set_column(table.schema.get_field_index("policy_version"), "policy_version",
                                    pa.array([f"iter-{iteration}"] * table.num_rows, pa.string()))

        steps = rekey(steps)
        for c in ("started_at", "ended_at"):
            steps = steps.set_column(steps.schema.get_field_index(c), c, pc.add(steps[c], pa.scalar(shift, pa.duration("us"))))
        shots = []
        mapping = {}
        for h, png in t.images.items():
            new = _png_with_text(png, run_id)
            shot = Screenshot.from_bytes(new, "png", *CAMPAIGN_SHOT_SIZE)
            mapping[h] = shot.hash
            shots.append(shot)
        if mapping:
            old_h = pa.array(list(mapping))
            pos = pc.index_in(steps["screenshot_hash"], value_set=old_h)
            steps = steps.set_column(steps.schema.get_field_index("screenshot_hash"), "screenshot_hash",
                                     pc.take(pa.array(list(mapping.values())), pos))
        candidates = rekey(t.candidates) if t.candidates.num_rows else t.candidates
        return steps, candidates, shots

    def append_run(self, lake: Lake, iteration: int, run_id: str | None = None) -> dict:
        """Append one iteration's run as a campaign does: its steps in ``commits_per_run`` commits, its candidates
        and screenshots, and its ``runs`` row; returns what was written."""
        from halo_data.writer import screenshots_table

        run_id = run_id or self.run_id(iteration)
        steps, candidates, shots = self.tables(iteration, run_id)
        now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(hours=iteration)
        lake.upsert_runs([runs.RunRecord(
            run_id=run_id, kind="rollout", mode="online", env="mixed", policy="hf", model="campaign",
            policy_version=f"iter-{iteration}", split="train", config={"iteration": iteration}, command="campaign",
            status="finished", started_at=now, ended_at=now + dt.timedelta(minutes=30),
            provenance=runs.provenance(generator="halo_data.synthetic.CampaignGenerator"),
        ).row()])
        if shots:
            lake.append("screenshots", screenshots_table(shots, now))
        # whole episodes per commit: split at an episode boundary
        parts = max(1, self.spec.commits_per_run)
        starts = [i for i, v in enumerate(steps["step_idx"].to_pylist()) if v == 0]
        cuts = [starts[len(starts) * k // parts] for k in range(parts)] + [steps.num_rows]
        for a, b in itertools.pairwise(cuts):
            if b > a:
                lake.append("steps", steps.slice(a, b - a))
        if candidates.num_rows:
            lake.append("candidates", candidates)
        return {"run_id": run_id, "steps": steps.num_rows, "candidates": candidates.num_rows, "screenshots": len(shots)}
