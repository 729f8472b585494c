"""Online GRPO: sample with the served policy, land the steps in the lake, update from its groups, reload, repeat.

    halo-train online-grpo --env miniwob --tasks click-button,click-tab --iterations 30 --group-size 8 \\
        --base-model models/tiny --output-dir out/online --serve

    from halo_train.online import OnlineConfig, run_online
    summary = run_online(OnlineConfig(base_model="models/tiny", tasks=["click-button"], serve=True))

Versions. Version v is the policy after v updates: ``OUTPUT/policy-{v}`` (version 0 is the base
model, or ``--init-adapter`` served as ``RUN-policy-0``). The engine serves one version at a time,
under the name ``RUN-policy-{v}`` (``halo_train.served.version_name``: runs sharing an engine never touch each
other's versions); every row a rollout writes carries ``policy_version = v`` of the
version that sampled it, never of a version that failed to load.

Each iteration k (one rollout run ``RUN-k{k}`` per iteration, so an iteration's rows are one run):

1. sample ``--group-size`` attempts of every task on ``--seeds-per-iteration`` N train task seeds
   ``--train-seed-start + k * N ...`` with the served version (stored with their sampled-token
   logprobs; with ``--constrain-actions`` each answer is one of the page's actions);
2. update with ``train_grpo`` reading only this run's rows of the served version from
   ``grpo_groups`` (``--group-by state``: from ``state_groups``, the ``--candidates-per-state``
   actions sampled in the one call at each visited state, each executed from that state restored
   by replay and scored with the dense reward; states that did not reproduce are left out)
   (dr_grpo by default, importance ratio against the stored logprobs), starting
   from the newest trained adapter (``--max-staleness`` bounds how far behind the served one may be);
3. save ``OUTPUT/policy-{v+1}`` (renamed into place only when complete);
4. load it into the engine as ``RUN-policy-{v+1}`` and unload the old name; a refused load keeps the
   old version serving and says so in one line;
5. record the iteration (lineage, adapter, metrics) in the online run's ``runs`` row and its
   metrics in ``train_metrics`` (step = k).

An iteration whose groups all have zero reward spread has nothing to learn from: it is recorded
without an update and the version stays. Held-out evaluation (``--eval-every``) runs the served
version on task seeds ``--eval-seed-start ...``, a range the train seeds never reach.

Pipelining (``--pipeline``). Iteration k's update runs in a spawned process while iteration k+1's
rollout samples with the version still served (v_k, which its rows carry); once both are done the
new adapter is loaded and iteration k recorded, and the rollout of k+2 samples with it. The update
of k+1 thus trains on rows one version stale (``--max-staleness`` must be at least 1). Iteration
k's record then also names the version that sampled rollout k+1 (``next_rollout``), complete by
then, so a resumed run trains on exactly those rows; the sequential loop is the default.

Engines. ``--serve`` starts the engine ``--engine`` picks: ``vllm serve BASE --enable-lora
--max-loras 2 --max-lora-rank R`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` on a GPU
(``halo_train.serve.vllm_command``), HALO's chat server on CPU; it waits until GET /v1/models
answers and ends that process group at the end.

Resume. An iteration is complete once its record is in the ``runs`` row. ``--resume`` reloads the
version served after the last complete one and redoes the rest of the interrupted iteration:
the rollout run resumes by its deterministic episode ids (nothing lost or written twice), and an
adapter folder already saved but not yet recorded is adopted, not trained again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

from halo_data.lake import Lake
from halo_data.prompts import OBSERVATION_FORMATS
from halo_data.runs import existing_run
from halo_train.config import GRPO_GROUP_VIEWS, GRPO_LOSS_TYPES, GRPOConfig, _field
from halo_train.data import EmptyViewError, NoTrainingSignalError
from halo_train.served import (
    OnlineError, OnlineSummary, Served, ServedLoopConfig, latest_adapter, loop_run_id, marks_status, open_engine,
    record_iteration, resumed_line, serve_start, start_record, update_version,
)

log = logging.getLogger(__name__)

GROUP_BY = ("episode", "state")  # attempts of one task seed (grpo_groups) | candidates at one state (state_groups)


@dataclasses.dataclass
class OnlineConfig(ServedLoopConfig):
    # Evaluation and pipelining change what a resumed run measures and when, not what it trains on.
    RESUME_MAY_CHANGE: ClassVar[frozenset[str]] = ServedLoopConfig.RESUME_MAY_CHANGE | {
        "pipeline", "eval_every", "eval_tasks", "eval_seeds", "eval_attempts", "eval_seed_start", "eval_temperature"}

    output_dir: str = _field("out/online", "Where policy-{v} adapter folders go.")
    group_size: int = _field(8, "Attempts per task and task seed: one GRPO group.")
    max_episode_steps: int = _field(5, "Steps per episode.")
    seeds_per_iteration: int = _field(1, "Train task seeds per iteration (a group each): iteration k samples seeds train_seed_start + k * N ... + N - 1.")
    observation: str = _field("axtree", "The page in the prompt: axtree (the whole tree) | elements (only the elements a policy may act on) | elements-v2 (those without descriptions).", choices=OBSERVATION_FORMATS)
    reward_config: str | None = _field(None, "Reward rules and weights YAML for the rollouts (default: halo_agent/configs/rewards.yaml; rewards-success.yaml pays for success only).")
    constrain_actions: bool = _field(False, "Constrain decoding to the page's actions (vLLM's structured-output choice; the chat server the same): every answer parses.")
    choice_labels: bool = _field(False, "With --constrain-actions: each choice names its element first (# 'Tab #2' then click('21')), so its log-probability includes words the goal names; the step's action stays the canonical call.")
    group_by: str = _field(
        "episode", "episode: G attempts of one task seed (GiGPO's step level included). state: at each visited state, "
        "--candidates-per-state actions sampled in one call, each executed from the state restored by replay and scored "
        "with the dense reward (state_groups; a state that does not reproduce is left out).", choices=GROUP_BY)
    candidates_per_state: int = _field(8, "With --group-by state: candidate actions sampled at each visited state, one group (at least 2); the episode goes on with the first.")
    cover_choices: bool = _field(False, "With --group-by state and --constrain-actions: a state's group is the sampled action and the page's other choices, each once (the --candidates-per-state - 1 most likely), instead of that many draws; each is scored from the restored state, so every offered action is compared with the others. Not drawn from the policy, they are compared with the group's lowest score (grpo --state-baseline min), not its mean.")
    choice_softmax: bool = _field(False, "With --group-by state and --constrain-actions: train each candidate's share of its state's candidates, the distribution the engine draws a constrained answer from, not its raw sequence probability (halo-train grpo --choice-softmax); --batch-size then counts state groups.")
    loss_type: str = _field("dr_grpo", "Loss aggregation (see halo-train grpo).", choices=GRPO_LOSS_TYPES)
    beta: float = _field(0.0, "KL coefficient of each update against the base model (adapter disabled); 0: none.")
    epsilon: float = _field(0.2, "Lower clip range of each update's importance ratio against the stored logprobs (see halo-train grpo).")
    epsilon_high: float | None = _field(None, "Upper clip range; --epsilon by default (DAPO uses 0.28). Covered choices all carry advantages of 0 or more, so only this bound clips them.")
    tis_cap: float | None = _field(None, "Truncated importance sampling for an engine/trainer mismatch: each token's loss "
                                   "weighted by min(pi_trainer / pi_engine, CAP), the ratio taken against the trainer's score "
                                   "before the update (halo-train grpo --tis-cap); off by default.")
    max_staleness: int = _field(1, "Train on rows at most this many versions older than the weights being updated.")
    replay_iterations: int = _field(1, "Each update reads the groups of this many latest iterations (this one included); --max-staleness still drops rows sampled by versions too old.")
    lr: float = _field(1e-5, "Learning rate (AdamW), constant after --warmup-steps.")
    omega: float = _field(1.0, "Weight of the anchor-state (GiGPO) step advantage: A = A_episode + omega * A_step; 0: episode-level GRPO only.")
    eval_every: int = _field(0, "Evaluate the served version on held-out task seeds every N iterations (0: never).")
    eval_tasks: list = _field([], "Tasks to evaluate (default: --tasks).")
    eval_seeds: int = _field(2, "Held-out task seeds: eval_seed_start ... eval_seed_start + eval_seeds - 1.")
    eval_seed_start: int = _field(100_000, "First held-out task seed; must lie past every train seed.")
    eval_attempts: int = _field(2, "Attempts per held-out task seed.")
    eval_temperature: float | None = _field(None, "Sampling temperature of the held-out evaluation (0: each step's most likely action; default: --temperature).")
    run_id: str | None = _field(None, "Run id of the online run (default: online-<UTC time>; --resume reads it from OUTPUT).")
    resume: bool = _field(False, "Continue the run in OUTPUT from its last complete iteration, with the options it started with (--iterations, the engine, --eval-* and --pipeline may change).")
    pipeline: bool = _field(False, "Overlap iteration k+1's rollout (sampled by the version still served) with iteration k's update (a spawned process); each update then trains on rows one version stale, so --max-staleness must be at least 1.")

    def __post_init__(self) -> None:
        self.check_served_loop(OnlineError)
        if isinstance(self.eval_tasks, str):
            self.eval_tasks = [t.strip() for t in self.eval_tasks.split(",") if t.strip()]
        self.eval_tasks = list(self.eval_tasks) or list(self.tasks)
        if self.group_by not in GROUP_BY:
            raise OnlineError(f"--group-by {self.group_by} is not built yet: use --group-by episode")
        if self.beta < 0:
            raise OnlineError(f"--beta must be 0 (no KL) or positive, got {self.beta}")
        if not 0 < self.epsilon < 1 or (self.epsilon_high is not None and self.epsilon_high <= 0):
            raise OnlineError(f"--epsilon must lie in (0, 1) and --epsilon-high be positive, got {self.epsilon} and {self.epsilon_high}")
        for name in ("group_size", "seeds_per_iteration", "max_episode_steps", "eval_seeds", "eval_attempts", "replay_iterations"):
            if int(getattr(self, name)) < 1:
                raise OnlineError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.group_size < 2 and self.group_by == "episode":
            raise OnlineError("--group-size must be at least 2: a group of one has no spread to learn from")
        if self.group_by == "state" and self.candidates_per_state < 2:
            raise OnlineError(f"--candidates-per-state must be at least 2, got {self.candidates_per_state}: a state's group of one has no spread to learn from")
        if self.eval_every < 0 or self.max_staleness < 0:
            raise OnlineError("--eval-every and --max-staleness must be 0 or more")
        if self.eval_temperature is not None and not 0 <= self.eval_temperature <= 2:
            raise OnlineError(f"--eval-temperature must lie in 0..2, got {self.eval_temperature}")
        train_seeds = range(self.train_seed_start, self.train_seed_start + self.iterations * self.seeds_per_iteration)
        eval_seeds = range(self.eval_seed_start, self.eval_seed_start + self.eval_seeds)
        if max(train_seeds.start, eval_seeds.start) < min(train_seeds.stop, eval_seeds.stop):
            raise OnlineError(
                f"train task seeds {train_seeds.start}..{train_seeds.stop - 1} overlap held-out seeds "
                f"{eval_seeds.start}..{eval_seeds.stop - 1}: raise --eval-seed-start past {train_seeds.stop - 1}"
            )
        if self.choice_labels and not self.constrain_actions:
            raise OnlineError("--choice-labels labels the choices of constrained decoding: add --constrain-actions")
        if self.cover_choices and not (self.constrain_actions and self.group_by == "state"):
            raise OnlineError("--cover-choices makes each state's group of the page's choices: add --group-by state and --constrain-actions")
        if self.choice_softmax and not (self.constrain_actions and self.group_by == "state"):
            raise OnlineError("--choice-softmax trains the share of a state's constrained choices: add --group-by state and --constrain-actions")
        if self.tis_cap is not None and (self.tis_cap <= 0 or self.learner != "persistent"):
            raise OnlineError(f"--tis-cap must be positive and goes with the persistent learner (--learner persistent), got {self.tis_cap} with --learner {self.learner}")
        if self.pipeline and self.max_staleness < 1:
            raise OnlineError(f"--pipeline trains each update on rows one version stale: give --max-staleness 1 or more, not {self.max_staleness}")


# ---------------------------------------------------------------------------------------- the loop


def run_online(cfg: OnlineConfig, echo: Callable[[str], None] = print) -> OnlineSummary:
    """Run (or resume) an online GRPO run; one line per iteration through ``echo``."""
    t0 = time.perf_counter()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    lake = Lake.init(cfg.lake)
    run_id = loop_run_id(cfg, out, "online", OnlineError)
    record, iterations = start_record(cfg, lake, run_id, "online-grpo", GRPO_GROUP_VIEWS[cfg.group_by], OnlineError)
    with marks_status(lake, lambda: record), open_engine(cfg, out) as (engine, base_name):
        served = serve_start(engine, cfg, run_id, iterations, OnlineError)
        if iterations:
            echo(resumed_line(run_id, iterations, cfg.iterations, served))
        trained = latest_adapter(cfg, run_id, iterations)
        loop = _pipelined if cfg.pipeline else _sequential
        for it in loop(cfg, lake, engine, base_name, run_id, len(iterations), served, trained, _next_sampler(iterations, served)):
            served = it.pop("_served")
            it.pop("_trained")
            record = record_iteration(lake, record, cfg, iterations, it, served)
            echo(_describe(it))
    return OnlineSummary(run_id, iterations, served.name, time.perf_counter() - t0, served.path)


def _next_sampler(iterations: list[dict[str, Any]], served: Served) -> Served:
    """The version the first iteration still to do samples with: the served one, unless a pipelined iteration
    already sampled it (its record names the version that did, the one served while that iteration's update trained)."""
    nxt = iterations[-1].get("next_rollout") if iterations else None
    if not nxt:
        return served
    return Served(nxt["name"], int(nxt["version"]), nxt["path"])


def _sequential(cfg, lake, engine, base_name, run_id, first: int, served: Served, trained: Served,
                sampler: Served) -> Iterator[dict[str, Any]]:
    """Iterations ``first`` ... one after the other: sample, update, reload."""
    for k in range(first, cfg.iterations):
        t0 = time.perf_counter()
        it = _iteration(cfg, lake, engine, base_name, run_id, k, served, trained, sampler)
        served, trained = it["_served"], it["_trained"]
        sampler = served
        it["metrics"]["iteration_seconds"] = time.perf_counter() - t0
        yield it


def _pipelined(cfg, lake, engine, base_name, run_id, first: int, served: Served, trained: Served,
               sampler: Served) -> Iterator[dict[str, Any]]:
    """Iterations ``first`` ... with iteration k's update (a spawned process) overlapping iteration k+1's rollout.

    The rollout of k+1 samples with the version still served while update k trains, so the update of k+1
    reads rows one version stale. Iteration k is recorded once both are done (then reloaded): a recorded
    iteration k therefore also means a complete rollout k+1, whose sampling version the record names
    (``next_rollout``), and ``--resume`` goes on from update k+1 with exactly those rows.
    """
    import multiprocessing

    if first >= cfg.iterations:
        return
    t_prev = time.perf_counter()
    # One update process for the run: its imports (torch, transformers) overlap the first rollout.
    pool = multiprocessing.get_context("spawn").Pool(1, initializer=_update_worker_init, initargs=(logging.getLogger().level,))
    try:
        pending = _sample(cfg, lake, engine, base_name, run_id, first, sampler)
        for k in range(first, cfg.iterations):
            it, metrics = pending
            job = pool.apply_async(_update_job, (cfg, _replayed(cfg, run_id, k), sampler, trained, run_id)) \
                if metrics["trainable_groups"] else None
            next_sampler = served  # update k has not been loaded yet: rollout k+1 samples with what serves now
            r0 = time.time()
            pending = _sample(cfg, lake, engine, base_name, run_id, k + 1, next_sampler) if k + 1 < cfg.iterations else None
            r1 = time.time()
            update, (u0, u1) = job.get() if job else (None, (r1, r1))
            metrics["pipeline_overlap_seconds"] = max(0.0, min(r1, u1) - max(r0, u0)) if pending else 0.0
            if pending:
                it["next_rollout"] = {"run": pending[0]["rollout_run"], "name": next_sampler.name,
                                      "version": next_sampler.version, "path": next_sampler.path}
            it = _conclude(cfg, engine, base_name, run_id, k, it, metrics, update, sampler, served, trained)
            served, trained, sampler = it["_served"], it["_trained"], next_sampler
            now = time.perf_counter()
            it["metrics"]["iteration_seconds"], t_prev = now - t_prev, now
            yield it
    finally:
        pool.terminate()
        pool.join()


def _update_worker_init(level: int) -> None:
    """The update process: the parent's log level, the libraries quiet as in the parent's CLI, torch imported now."""
    import warnings

    logging.basicConfig(level=level or logging.WARNING, format="%(message)s")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    from transformers.utils import logging as hf_logging

    if level > logging.DEBUG:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    import halo_train.grpo  # noqa: F401  (the first update would wait for these imports)


def _update_job(cfg: OnlineConfig, rollout_runs: list[str], sampled: Served, trained: Served, run_id: str):
    """``_update`` in the update process; with the wall-clock times it started and ended."""
    import pickle

    t0 = time.time()
    try:
        update = _update(cfg, Lake.open(cfg.lake), rollout_runs, sampled, trained, run_id)
    except Exception as e:  # the parent gets the error itself, or its line where it cannot be sent (a Rust error type)
        try:
            pickle.dumps(e)
        except Exception:
            raise RuntimeError(f"update of v{trained.version} failed: {type(e).__name__}: {e}") from None
        raise
    return update, (t0, time.time())


def _replayed(cfg: OnlineConfig, run_id: str, k: int) -> list[str]:
    """The rollout runs update k reads: iteration k's, and the ones before it under --replay-iterations."""
    return [f"{run_id}-k{j}" for j in range(max(0, k - cfg.replay_iterations + 1), k + 1)]


def _iteration(cfg, lake, engine, base_name, run_id, k, served: Served, trained: Served,
               sampler: Served | None = None) -> dict[str, Any]:
    """One iteration: sample with ``sampler`` (``served`` unless a pipelined run sampled it), update ``trained``,
    save, reload; its record."""
    sampler = sampler or served
    it, metrics = _sample(cfg, lake, engine, base_name, run_id, k, sampler)
    update = _update(cfg, lake, _replayed(cfg, run_id, k), sampler, trained, run_id) if metrics["trainable_groups"] else None
    return _conclude(cfg, engine, base_name, run_id, k, it, metrics, update, sampler, served, trained)


def _sample(cfg, lake, engine, base_name, run_id, k, sampler: Served) -> tuple[dict[str, Any], dict[str, float]]:
    """Iteration k's rollout run with ``sampler`` (resumed where it exists) and its figures."""
    first_seed = cfg.train_seed_start + k * cfg.seeds_per_iteration
    rollout = _rollout(cfg, engine, base_name, sampler, f"{run_id}-k{k}", first_seed, cfg.group_size, "rollout",
                       task_seeds=cfg.seeds_per_iteration)
    stats = _run_stats(lake, rollout.run_id, _view_weights(cfg))
    metrics: dict[str, float] = {
        "policy_version": sampler.version, "rewards/mean": stats["reward_mean"], "rewards/std": stats["reward_std"],
        "success_rate/train": stats["success_rate"], "frac_reward_zero_std": stats["frac_reward_zero_std"],
        "trainable_groups": stats["n_trainable_groups"],
    }
    if rollout.steps:  # a resumed iteration whose rollout is already in the lake sampled nothing: no speed to record
        metrics["rollout_steps_per_second"] = rollout.steps_per_second
    metrics.update(_spread(lake, rollout.run_id, _view_weights(cfg)))
    if "unreproducible_states" in stats:  # --group-by state: states left out of training because they did not restore
        metrics["unreproducible_states"] = stats["unreproducible_states"]
    it: dict[str, Any] = {"iteration": k, "rollout_run": rollout.run_id, "sampled_by": sampler.name or base_name,
                          "sampled_version": sampler.version, "task_seed": first_seed, "task_seeds": cfg.seeds_per_iteration}
    return it, metrics


def _conclude(cfg, engine, base_name, run_id, k, it: dict[str, Any], metrics: dict[str, float], update: dict[str, Any] | None,
              sampler: Served, served: Served, trained: Served) -> dict[str, Any]:
    """After update k: load its adapter in place of ``served`` (a refused load keeps ``served``), evaluate if due."""
    it["_trained"], it["_served"] = trained, served
    if update is None:
        flat = not metrics["trainable_groups"]
        it["update"] = "skipped: every group has zero reward spread" if flat else (
            f"skipped: v{sampler.version}'s rows are staler than --max-staleness {cfg.max_staleness} for v{trained.version}")
    else:
        new = Served.version_of(run_id, trained.version + 1, update["adapter"])
        it.update(adapter=new.path, train_run=update["run_id"], lineage=update["lineage"], update="trained")
        metrics.update(update["metrics"])
        swap = engine.swap_adapter(new.name, new.path, retire=served.name)
        metrics["reload_seconds"] = swap.seconds
        it["reload"] = swap.message
        it["_trained"] = new
        if swap.loaded:
            it["_served"] = new
        else:
            log.info("reload refused: %s", swap.message)  # the iteration's line says so
    if cfg.eval_every and (k + 1) % cfg.eval_every == 0:
        metrics["success_rate/heldout"] = evaluate(cfg, engine, base_name, it["_served"], run_id)
    it["served_after"] = {"name": it["_served"].name, "version": it["_served"].version, "path": it["_served"].path}
    it["metrics"] = {k_: float(v) for k_, v in metrics.items() if v is not None}
    return it


# ---------------------------------------------------------------------------------------- sampling


def _rollout(cfg: OnlineConfig, engine, base_name: str, served: Served, run_id: str, task_seed: int, attempts: int,
             kind: str, tasks: list[str] | None = None, policy: str = "openai", task_seeds: int = 1):
    """One rollout (or eval) run of the served version into the lake, resumed where it already exists."""
    from halo_agent.rollout import RolloutConfig, run_rollouts

    lake = Lake.open(cfg.lake)
    # The served version through the engine; any other policy (the random baseline) needs none of it.
    through_engine = dict(
        model=base_name, adapter=served.name, policy_version=str(served.version),
        policy_options={"base_url": engine.base_url, "max_tokens": cfg.max_tokens, "constrain_actions": cfg.constrain_actions,
                        "choice_labels": cfg.choice_labels, **screenshot_options(cfg),
                        **({"cover_choices": True} if cfg.cover_choices and kind == "rollout" else {})},
    ) if policy == "openai" else {}
    return run_rollouts(RolloutConfig(
        env=cfg.env, tasks=list(tasks or cfg.tasks), rollouts_per_task=attempts, policy=policy, **through_engine,
        # --group-by state: the policy's one call at each state draws the candidates, scored from the restored state
        candidates_per_state=cfg.candidates_per_state if cfg.group_by == "state" and kind == "rollout" else 0,
        temperature=eval_temperature(cfg) if kind == "eval" else cfg.temperature, seed=cfg.seed + task_seed,
        task_seed=task_seed, task_seeds=task_seeds, max_steps=cfg.max_episode_steps,
        observation=cfg.observation, reward_config=cfg.reward_config, env_options=cfg.environment_options(),
        lake=cfg.lake, run_id=run_id, resume=existing_run(lake, run_id) is not None, kind=kind,
        progress=cfg.progress, command="halo-train online-grpo",
    )).stop_if_interrupted()


def screenshot_options(cfg: OnlineConfig) -> dict[str, Any]:
    """A vision-language base model is sampled in screenshot mode (its steps' prompts carry the image)."""
    from halo_agent.vlm import is_vlm

    if not is_vlm(cfg.base_model):
        return {}
    return {"use_screenshot": True, **({"coordinate_scale": cfg.coordinate_scale} if cfg.coordinate_scale else {})}


def eval_temperature(cfg: OnlineConfig) -> float:
    return cfg.temperature if cfg.eval_temperature is None else cfg.eval_temperature


def evaluate(cfg: OnlineConfig, engine, base_name: str, served: Served, run_id: str, policy: str = "openai") -> float:
    """Success rate of ``served`` (or the random policy) on the held-out task seeds; one eval run per seed, named
    after the version (and the temperature, where it is not the sampling one)."""
    lake = Lake.open(cfg.lake)
    label = f"v{served.version}" if policy == "openai" else policy
    if policy == "openai" and eval_temperature(cfg) != cfg.temperature:
        label += f"-t{eval_temperature(cfg):g}"
    run_ids = []
    for seed in range(cfg.eval_seed_start, cfg.eval_seed_start + cfg.eval_seeds):
        r = _rollout(cfg, engine, base_name, served, f"{run_id}-eval-{label}-s{seed}", seed, cfg.eval_attempts, "eval",
                     tasks=cfg.eval_tasks, policy=policy)
        run_ids.append(r.run_id)
    row = lake.query_arrow(
        "select avg(success::double) from episodes where list_contains($ids, run_id)", {"ids": run_ids}
    ).column(0)[0].as_py()
    return float(row or 0.0)


def _view_weights(cfg: OnlineConfig) -> dict[str, float]:
    """The reward config's weights as view parameters: the views re-weight the stored components with them."""
    if not cfg.reward_config:
        return {}
    from halo_agent.rewards import RewardConfig

    return {f"w_{k}": v for k, v in RewardConfig.load(cfg.reward_config).weights.as_dict().items()}


def _run_stats(lake: Lake, run_id: str, weights: dict[str, float]) -> dict[str, float]:
    """The run's episode figures (reward_stats); for a run that sampled candidates (--group-by state), the
    groups counted (trainable, flat) are its state groups, the ones its update reads."""
    rows = lake.query_arrow(
        "select reward_mean, reward_std, frac_reward_zero_std, n_trainable_groups, success_rate "
        "from reward_stats where scope = 'run' and run_id = $r", {"r": run_id}, params=weights,
    ).to_pylist()
    if not rows:
        raise OnlineError(f"rollout run {run_id} wrote no episodes without errors: check the engine and the tasks")
    stats = {k: float(v or 0.0) for k, v in rows[0].items()}
    states = lake.query_arrow(STATE_STATS_SQL, {"r": run_id}).to_pylist()[0]
    if states["candidates"]:
        stats.update(n_trainable_groups=float(states["trainable"] or 0), unreproducible_states=float(states["unreproducible"] or 0),
                     frac_reward_zero_std=float(states["flat"]) / states["groups"] if states["groups"] else 1.0)
    return stats


# A run's step rows, and its groups of attempts (task seed, version) by where their rewards spread: in success, or
# only in the shaping terms (progress, novelty, loop, validity), which teach the policy the shaping, not the task.
SPREAD_SQL = """
WITH g AS (
    SELECT task_id, task_seed, policy_version,
           count(DISTINCT success) > 1 AS success_spread,
           coalesce(stddev_samp(shaped_return), 0) > 1e-9 AS reward_spread
    FROM episodes WHERE run_id = $r GROUP BY ALL
)
SELECT (SELECT count(*) FROM steps WHERE run_id = $r) AS rows_produced,
       count(*) FILTER (WHERE success_spread) AS groups_success_spread,
       count(*) FILTER (WHERE reward_spread AND NOT success_spread) AS groups_shaping_spread_only
FROM g
"""


def _spread(lake: Lake, run_id: str, weights: dict[str, float]) -> dict[str, float]:
    row = lake.query_arrow(SPREAD_SQL, {"r": run_id}, params=weights, runs=[run_id]).to_pylist()[0]
    return {k: float(v or 0) for k, v in row.items()}


# A run's state groups (state_groups: the states that reproduced) and the states that did not.
STATE_STATS_SQL = """
WITH groups AS (SELECT group_key, any_value(zero_std) AS zero_std FROM state_groups WHERE run_id = $r GROUP BY group_key)
SELECT
    (SELECT count(*) FROM candidates WHERE run_id = $r) AS candidates,
    (SELECT count(*) FROM groups) AS groups,
    (SELECT count(*) FROM groups WHERE NOT zero_std) AS trainable,
    (SELECT count(*) FROM groups WHERE zero_std) AS flat,
    (SELECT count(DISTINCT (episode_id, step_idx)) FROM candidates WHERE run_id = $r AND score_source = 'unreproducible') AS unreproducible
"""


# ---------------------------------------------------------------------------------------- updating


def _update(cfg: OnlineConfig, lake: Lake, rollout_runs: list[str], served: Served, trained: Served, run_id: str) -> dict[str, Any] | None:
    """Train ``trained`` on the rollout runs' rows into ``OUTPUT/policy-{v+1}``; an adapter already saved is adopted.

    One rollout run (the default): only its rows of the served version. Several (--replay-iterations): all
    their rows, each group kept with its own version and stored logprobs, --max-staleness dropping the oldest.
    The rows are read from views computed over those runs only (``--runs``: no other run's attempts join a group).
    """
    final = Path(cfg.output_dir) / f"policy-{trained.version + 1}"
    grpo = _update_config(cfg, rollout_runs, served, trained, run_id)
    try:
        stats = update_version(cfg, lake, grpo, trained, final, GRPO_GROUP_VIEWS[cfg.group_by], OnlineError)
    except (EmptyViewError, NoTrainingSignalError) as e:  # every group flat or too stale: nothing to learn now
        log.info("no update: %s", e)
        return None
    recorded = stats.get("update_metrics") or {}
    trainer_metrics = stats.get("metrics") or {}
    return {
        "adapter": final.resolve(), "run_id": stats["run_id"], "lineage": stats.get("lineage"),
        "metrics": {"update_seconds": stats.get("update_seconds"), **recorded,
                    **{m: trainer_metrics[m] for m in ("loss", "clip_ratio", "importance_ratio_mean", "kl", "approx_kl")
                       if m in trainer_metrics and m not in recorded}},
    }


def _update_config(cfg: OnlineConfig, rollout_runs: list[str], served: Served, trained: Served, run_id: str) -> GRPOConfig:
    """What update v+1 reads and how it computes its loss, as a ``halo-train grpo`` job's config."""
    version = trained.version + 1
    return GRPOConfig(
        lake=cfg.lake, base_model=cfg.base_model, init_adapter=trained.path,
        output_dir=str(Path(cfg.output_dir) / "updates" / f"update-{version}"),
        run_id=f"{run_id}-u{version}", runs=list(rollout_runs), where=_rows_of(rollout_runs, served), group_by=cfg.group_by,
        state_baseline="min" if cfg.cover_choices else "mean",
        policy_version=trained.version, max_staleness=cfg.max_staleness, loss_type=cfg.loss_type,
        max_steps=cfg.job_steps(), lr=cfg.lr, lora_r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, batch_size=cfg.batch_size, seed=cfg.seed + version,
        # Its own run's groups only: another run's attempts at the same task seed carry the same version
        # names ('0', '1', ...) but come from another policy.
        params={**_view_weights(cfg), "group_scope": "run", "omega": cfg.omega},
        beta=cfg.beta, epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high, choice_softmax=cfg.choice_softmax,
        tis_cap=cfg.tis_cap,
    )


def _rows_of(rollout_runs: list[str], served: Served) -> str:
    """The update's filter on its groups' view: the latest rollout run's rows of the served version, or the replayed runs'."""
    if len(rollout_runs) == 1:
        return f"run_id = '{rollout_runs[0]}' and policy_version = '{served.version}'"
    return "run_id in (" + ", ".join(f"'{r}'" for r in rollout_runs) + ")"


# ---------------------------------------------------------------------------------------- the record


def _describe(it: dict[str, Any]) -> str:
    """One line per iteration for a person."""
    m = it["metrics"]
    text = (
        f"iteration {it['iteration']}: sampled v{it['sampled_version']} "
        f"reward {m['rewards/mean']:.3f}±{m['rewards/std']:.3f}, success {m['success_rate/train']:.0%}, "
        f"{int(m['trainable_groups'])} trainable groups ({m['frac_reward_zero_std']:.0%} flat), "
        + (f"{m['rollout_steps_per_second']:.1f} steps/s" if "rollout_steps_per_second" in m else "rollout already in the lake")
    )
    if it["update"] != "trained":
        text += f"; no update ({it['update']})"
    else:
        trained = f"{int(m['rows_trained'])} rows, " if "rows_trained" in m else ""
        if m.get("early_stopped"):  # --target-kl ended it before every row was trained on
            trained = f"{int(m['rows_trained'])} of {int(m['rows_read'])} rows (stopped at KL {m['stop_kl']:.3g}), "
        moved = f", moved {m['displacement_from_previous']:.3g}" if "displacement_from_previous" in m else ""
        text += f"; update {trained}{m.get('update_seconds', 0):.1f} s{moved} -> {Path(it['adapter']).name}"
        text += f", reload {m['reload_seconds']:.2f} s" if it["served_after"]["path"] == it["adapter"] else f"; {it['reload']}"
    if "success_rate/heldout" in m:
        text += f"; held-out success {m['success_rate/heldout']:.0%}"
    return text
