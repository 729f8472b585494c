"""An experiment's runner: the protocol's plan, stage by stage, through HALO's own commands.

``run`` goes through the plan in order — the non-learned arms' evaluations (random, heuristic, zero_shot), then
per training seed each trained arm's training (the base model's sampling for bc and dpo, expert iteration's rounds,
``halo-train online-grpo``) followed by its evaluations — and skips what is done. What is done is read from the
lake (episodes per run id) and the output folders (a final adapter, an online run's recorded iterations), never
from memory: a killed run is resumed by the same command, each stage through HALO's own ``--resume``
(``halo-agent rollout --resume``, ``halo-train bc/dpo --resume-from OUTPUT/checkpoint-N``, ``halo-train
online-grpo --resume``). An arm's test seeds are evaluated only once its training is final, and only once
(``halo_train.experiment.record``). Every stage runs at the registered commit and is recorded with it.
Everything lands under the root: the lake, the adapters, each command's log, ``commands.log``, the records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

from halo_train.experiment.protocol import EvalCell, Protocol
from halo_train.experiment.record import ExperimentError, Records, code_identity, machine, now, policy_fingerprint
from halo_train.experiment.state import BASE_MODEL, LakeState

log = logging.getLogger(__name__)
BIN = Path(sys.executable).parent


def resolve_base_model(name: str) -> str:
    """The base model's folder: HALO's resolver, or the name itself where it does not resolve (a dry run)."""
    from halo_agent.models import resolve_model

    try:
        return resolve_model(name)
    except Exception:  # an unknown name or a model not converted yet: the commands will say so when they run
        return name


def _flag(key: str, value: Any) -> list[str]:
    """A hyperparameter as a command's option: ``group_size: 8`` -> ``--group-size 8``; booleans as --x/--no-x."""
    name = key.replace("_", "-")
    if isinstance(value, bool):
        return [f"--{name}" if value else f"--no-{name}"]
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return [f"--{name}", str(value)]


@dataclasses.dataclass(frozen=True)
class StageStatus:
    """How far one stage is: a run's episodes, an online arm's iterations, or an offline training job (1 of 1 once
    its final adapter is there)."""

    stage: str
    there: int
    planned: int
    unit: str = "episodes"  # "episodes", "iterations" or "job"
    note: str = ""  # what the last iteration of an online run still going did

    @property
    def done(self) -> bool:
        return self.there >= self.planned

    def __str__(self) -> str:
        if self.unit == "job" or (self.unit == "iterations" and self.done):
            text = "done" if self.done else "not done"
        else:
            text = f"{self.there}/{self.planned}" + (" iterations" if self.unit == "iterations" else "")
        return text + (f" ({self.note})" if self.note else "")


def checkpoint_step(checkpoint: Path) -> int:
    return int(checkpoint.name.rsplit("-", 1)[1])


def last_checkpoint(job: Path) -> Path | None:
    """A training job's newest ``checkpoint-N`` folder, the one ``--resume-from`` takes; None before its first."""
    return max(job.glob("checkpoint-*"), key=checkpoint_step, default=None)


def iterations_note(its: list[dict[str, Any]], planned: int) -> str:
    """An online run's last iteration, and the time its remaining ones take at the pace of those recorded."""
    if not its or len(its) >= planned:
        return ""
    m = its[-1].get("metrics") or {}
    parts = []
    if "success_rate/train" in m:
        parts.append(f"last: sampled success {100 * m['success_rate/train']:.0f}%")
    if "rows_trained" in m:
        parts.append(f"{m['rows_trained']:.0f} rows trained")
    if "displacement_from_previous" in m:
        parts.append(f"moved {m['displacement_from_previous']:.4f}")
    seconds = [it["metrics"]["iteration_seconds"] for it in its if "iteration_seconds" in (it.get("metrics") or {})]
    if seconds:
        parts.append(f"about {sum(seconds) / len(seconds) * (planned - len(its)) / 60:.0f} min left")
    return ", ".join(parts)


class Runner:
    """The plan of one protocol under ``root``; ``run_*`` methods each do one stage if it is not done."""

    def __init__(self, protocol: Protocol, root: str | Path, workers: int = 1, dry_run: bool = False,
                 code_dir: Path | None = None, enforce: bool = True):
        self.p = protocol
        self.root = Path(root).resolve()
        self.lake = self.root / "lake"
        self.workers = workers
        self.dry_run = dry_run
        self.enforce = enforce and not dry_run  # registration, commit and test-once checks (screening: off)
        self.records = Records(self.root, code_dir)
        self.base_model = resolve_base_model(protocol.base_model)
        self.served_name = Path(self.base_model).name
        self.cwd = Path(protocol.path).resolve().parent

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> LakeState:
        return LakeState(self.lake)

    def adapter_dir(self, arm: str, seed: int) -> Path:
        return self.root / "adapters" / f"{arm}-s{seed}"

    def _path(self, value: str) -> str:
        """A file the protocol names (a reward config), relative to HALO's checkout or the protocol's folder."""
        from halo_train.experiment.record import CODE_DIR

        for base in (CODE_DIR, self.cwd, Path.cwd()):
            if (base / value).exists():
                return str(base / value)
        return value

    def final_adapter(self, arm: str, seed: int) -> str | None:
        """The arm's final adapter folder once its training is complete (BASE_MODEL: it ended on the base
        model); None before."""
        method = self.p.method(arm)
        if method == "online":
            return self.state.online_final(self.p.online_run(seed, arm), int(self.p.hyperparameters[arm]["iterations"]))
        if method == "expert_iteration":
            return self.round_policy(arm, seed, self.p.rounds(arm) - 1)
        final = self.adapter_dir(arm, seed) / "final"
        if (final / "adapter_config.json").exists():
            return str(final)
        return BASE_MODEL if self.nothing_to_train_on(arm, seed) else None

    def sample_complete(self, seed: int) -> bool:
        """Every episode of the budget sampled: an offline arm trains on all of it, never on a part."""
        return self.state.episodes(self.p.sample_run(seed)) >= self.p.sample_episodes

    def _count(self, sql: str, run_ids: list[str]) -> int:
        rows = self.state.query(sql, {"r": run_ids})
        return int(rows[0]["n"]) if rows else 0

    def nothing_to_train_on(self, arm: str, seed: int) -> bool:
        """bc without one successful sampled episode, dpo without one pair: once the sampling is complete, the arm
        has no data, so its final policy is the base model (the report's rows say so by their seeds)."""
        if not self.sample_complete(seed):
            return False
        sql = {"bc": "select count(*) AS n from episodes where list_contains($r, run_id) and success",
               "dpo": "select count(*) AS n from dpo_pairs where list_contains($r, run_id) and source = 'episodes'"}
        return self._count(sql[self.p.method(arm)], [self.p.sample_run(seed)]) == 0

    def job_note(self, arm: str, seed: int) -> str:
        """How far an offline arm's training job is: the step of the checkpoint `run` resumes it from (of a round, for
        expert iteration)."""
        folder = self.adapter_dir(arm, seed)
        if self.p.method(arm) == "expert_iteration":
            rounds = [r for r in range(self.p.rounds(arm)) if self.round_dir(arm, seed, r).is_dir()]
            if not rounds:
                return ""
            folder = self.round_dir(arm, seed, rounds[-1])
            if (folder / "final" / "adapter_config.json").exists():
                return f"round {rounds[-1]} trained"
        checkpoint = last_checkpoint(folder)
        if checkpoint is None:
            return ""
        total = self.p.hyperparameters.get(arm, {}).get("max_steps")
        where = f"round {folder.name.removeprefix('round-')}: " if folder.name.startswith("round-") else ""
        return f"{where}checkpoint at step {checkpoint_step(checkpoint)}" + (f" of {total}" if total else "")

    # ------------------------------------------------------------------ expert iteration's rounds
    def round_dir(self, arm: str, seed: int, r: int) -> Path:
        return self.adapter_dir(arm, seed) / f"round-{r}"

    def round_runs(self, arm: str, seed: int, r: int) -> list[str]:
        return [self.p.round_run(arm, seed, i) for i in range(r + 1)]

    def round_policy(self, arm: str, seed: int, r: int) -> str | None:
        """The policy after round ``r`` (-1: the base model): its adapter, BASE_MODEL while no round had a success
        to learn from, None while round r is not done."""
        if r < 0:
            return BASE_MODEL
        final = self.round_dir(arm, seed, r) / "final"
        if (final / "adapter_config.json").exists():
            return str(final)
        if self.state.episodes(self.p.round_run(arm, seed, r)) < self.p.round_episodes(arm):
            return None
        successes = self._count("select count(*) AS n from episodes where list_contains($r, run_id) and success",
                                self.round_runs(arm, seed, r))
        return self.round_policy(arm, seed, r - 1) if successes == 0 else None

    # ------------------------------------------------------------------ commands
    def _call(self, argv: list[str], log_name: str, stage: dict[str, Any] | None = None) -> None:
        """Run one stage's command; with ``enforce``, only at the registered commit, recorded at start and end."""
        identity = self.records.check(self.p) if self.enforce else None
        self.root.mkdir(parents=True, exist_ok=True)
        line = shlex.join(argv)
        with open(self.root / "commands.log", "a") as f:
            f.write(f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ} {line}\n")
        log.info("%s", line)
        if self.dry_run:
            return
        record = {"stage": log_name, **(stage or {}), **(identity or code_identity(self.records.code_dir))}
        if self.enforce:
            self.records.append({**record, "event": "start", "at": now(), "machine": machine()})
        (self.root / "logs").mkdir(exist_ok=True)
        with open(self.root / "logs" / f"{log_name}.log", "a") as out:
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
            try:
                rc = child.wait()
            except BaseException:  # the runner is stopped (SIGTERM, Ctrl-C): stop the stage too; --resume continues it
                child.terminate()
                try:
                    child.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    child.kill()
                raise
        if self.enforce:
            self.records.append({"stage": log_name, "run_id": record.get("run_id"), "event": "end", "rc": rc, "at": now()})
        if rc != 0:
            raise RuntimeError(f"{argv[0]} exited {rc}: see {self.root / 'logs' / (log_name + '.log')}")

    def _interface_options(self, temperature: float | None = None) -> list[str]:
        i = self.p.interface
        t = i["temperature"] if temperature is None else temperature
        env_options = [arg for key, value in self.p.env_options().items() for arg in ("--env-option", f"{key}={value}")]
        return ["--env", i["env"], "--observation", i["observation"], "--max-steps", str(i["max_steps"]),
                "--temperature", str(t), "--reward-config", self._path(i["reward_config"]), *env_options,
                "--lake", str(self.lake), "--no-progress", "--workers", str(self.workers)]

    @contextlib.contextmanager
    def engine(self, adapters: dict[str, str]) -> Iterator[str]:
        """HALO's chat server with the base model and ``adapters`` for the length of a block; its URL."""
        if self.dry_run:
            yield "http://127.0.0.1:0/v1"
            return
        from halo_train.serve import ServeSpec, free_port, running

        spec = ServeSpec(base_model=self.base_model, adapters=adapters, port=free_port(), engine="chat")
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        with running(spec, self.root / "logs" / "engine.log") as state:
            yield state["url"]

    def rollout(self, run_id: str, tasks: tuple[str, ...], first_seed: int, seeds: int, attempts: int, seed: int,
                policy: list[str], planned: int, temperature: float | None = None,
                stage: dict[str, Any] | None = None) -> None:
        """``halo-agent rollout`` of a run id into the lake, resumed where it exists; nothing when complete."""
        done = self.state.episodes(run_id)
        if done >= planned:
            return
        argv = self.rollout_argv(run_id, tasks, first_seed, seeds, attempts, seed, policy, temperature)
        if done or self.state.has_run(run_id):
            argv.append("--resume")
        log.info("%s: %d of %d episodes there", run_id, done, planned)
        self._call(argv, run_id, {"kind": "rollout", "run_id": run_id, **(stage or {})})

    def rollout_argv(self, run_id: str, tasks: tuple[str, ...], first_seed: int, seeds: int, attempts: int, seed: int,
                     policy: list[str], temperature: float | None = None) -> list[str]:
        return [str(BIN / "halo-agent"), "rollout", "--tasks", ",".join(tasks), "--task-seed", str(first_seed),
                "--task-seeds", str(seeds), "--rollouts-per-task", str(attempts), "--seed", str(seed),
                "--run-id", run_id, *self._interface_options(temperature), *policy]

    def model_policy(self, url: str, adapter: str | None = None) -> list[str]:
        argv = ["--policy", "openai", "--model", self.served_name, "--policy-option", f"base_url={url}",
                "--policy-option", f"constrain_actions={str(self.p.interface['constrain_actions']).lower()}",
                "--policy-option", f"choice_labels={str(self.p.interface.get('choice_labels', False)).lower()}"]
        return argv + (["--adapter", adapter, "--policy-version", adapter] if adapter else [])

    def policy_arm(self, arm: str) -> list[str]:
        spec = self.p.arms[arm]
        argv = ["--policy", spec["policy"], "--mode", arm]
        for key, value in (spec.get("options") or {}).items():
            argv += ["--policy-option", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
        return argv

    def evaluate(self, cell: EvalCell, policy: list[str], adapter: str | None = None) -> None:
        """One evaluation cell; a test cell only once (refused where it was evaluated before with another policy,
        or where its episodes are gone)."""
        stage: dict[str, Any] = {"kind": "eval", "arm": cell.arm, "seed": cell.training_seed, "split": cell.split}
        if cell.is_test and self.enforce and self.state.episodes(cell.run_id) < cell.episodes:
            fingerprint = self.p.arms[cell.arm].get("policy") or policy_fingerprint(adapter, self.base_model)
            self.records.check_test_once(cell.run_id, fingerprint, self.state.episodes(cell.run_id))
            stage.update(test=True, policy=fingerprint)
        self.rollout(cell.run_id, cell.tasks, cell.first_seed, cell.seeds, cell.attempts,
                     self.p.policy_seed(cell.training_seed), policy, cell.episodes, cell.temperature, stage)

    # ------------------------------------------------------------------ stages
    def missing(self, cells: list[EvalCell]) -> list[EvalCell]:
        return [c for c in cells if self.state.episodes(c.run_id) < c.episodes]

    def run_policy_arm(self, arm: str) -> None:
        for seed in self.p.arm_seeds(arm):
            for cell in self.p.eval_cells(arm, seed):
                self.evaluate(cell, self.policy_arm(arm))

    def run_zero_shot(self) -> None:
        cells = [c for seed in self.p.arm_seeds("zero_shot") for c in self.missing(self.p.eval_cells("zero_shot", seed))]
        if not cells:
            return
        with self.engine({}) as url:
            for cell in cells:
                self.evaluate(cell, [*self.model_policy(url), "--mode", "zero_shot"])

    def run_sample(self, seed: int) -> None:
        """The base model's episodes on the train task seeds of one training seed (the offline arms' data)."""
        if self.sample_complete(seed):
            return
        sample = self.p.sample_spec
        with self.engine({}) as url:
            self.rollout(self.p.sample_run(seed), self.p.tasks(self.p.train_tasks), self.p.train_seed_start(seed),
                         int(sample["task_seeds"]), int(sample["attempts"]), seed,
                         [*self.model_policy(url), "--mode", "sample"], self.p.sample_episodes)

    def _train_job(self, arm: str, seed: int, job: str, out: Path, extra: list[str]) -> None:
        lora = self.p.hyperparameters["lora"]
        argv = [str(BIN / "halo-train"), job, "--lake", str(self.lake), "--base-model", self.base_model,
                "--output-dir", str(out), "--seed", str(seed), "--lora-r", str(lora["r"]), "--lora-alpha", str(lora["alpha"]),
                "--adapter-name", arm, "--save-steps", "4", *extra]
        checkpoint = last_checkpoint(out)
        if checkpoint is not None:
            argv += ["--resume-from", str(checkpoint)]
        self._call(argv, out.relative_to(self.root / "adapters").as_posix().replace("/", "-"),
                   {"kind": "train", "arm": arm, "seed": seed})

    def _offline_ready(self, arm: str, seed: int) -> bool:
        final = self.final_adapter(arm, seed)
        if final == BASE_MODEL:
            log.warning("%s seed %d: nothing to train on in %s: the base model stands for it", arm, seed, self.p.sample_run(seed))
        if final is not None:
            return False
        if not self.sample_complete(seed) and not self.dry_run:
            log.warning("%s seed %d waits for the whole sample %s", arm, seed, self.p.sample_run(seed))
            return False
        return True

    def _bc_options(self, h: dict[str, Any], where: str) -> list[str]:
        return ["--where", where, "--top-percent", "100", "--max-steps", str(h["max_steps"]), "--batch-size",
                str(h["batch_size"]), "--lr", str(h["lr"]), "--lora-dropout", str(h["lora_dropout"])]

    def run_bc(self, seed: int, arm: str = "bc_filtered") -> None:
        if self._offline_ready(arm, seed):
            where = f"run_id = '{self.p.sample_run(seed)}' AND success"
            self._train_job(arm, seed, "bc", self.adapter_dir(arm, seed), self._bc_options(self.p.hyperparameters[arm], where))

    def run_dpo(self, seed: int, arm: str = "dpo") -> None:
        if self._offline_ready(arm, seed):
            h = self.p.hyperparameters[arm]
            self._train_job(arm, seed, "dpo", self.adapter_dir(arm, seed), [
                "--where", f"run_id = '{self.p.sample_run(seed)}'", "--source", "episodes",
                "--max-steps", str(h["max_steps"]), "--batch-size", str(h["batch_size"]), "--lr", str(h["lr"]),
                "--beta", str(h["beta"]), "--loss-type", h["loss_type"], "--lora-dropout", str(h["lora_dropout"])])

    def run_expert_iteration(self, seed: int, arm: str = "bc_filtered") -> None:
        """Rounds of sample -> keep successes -> SFT: round r samples its task seeds with round r-1's policy (the
        base model first), then SFT from the base model on every success of rounds 0..r."""
        h, spec = self.p.hyperparameters[arm], self.p.round_spec(arm)
        for r in range(self.p.rounds(arm)):
            run_id = self.p.round_run(arm, seed, r)
            previous = self.round_policy(arm, seed, r - 1)
            if previous is None:
                return  # dry run, or an earlier round did not finish
            if self.state.episodes(run_id) < self.p.round_episodes(arm):
                name = None if previous == BASE_MODEL else f"{arm}-s{seed}-r{r - 1}"
                with self.engine({name: previous} if name else {}) as url:
                    self.rollout(run_id, self.p.tasks(self.p.train_tasks),
                                 self.p.train_seed_start(seed) + r * spec["task_seeds"], spec["task_seeds"],
                                 spec["attempts"], seed, [*self.model_policy(url, name), "--mode", f"{arm}-r{r}"],
                                 self.p.round_episodes(arm), stage={"kind": "sample", "arm": arm, "seed": seed, "round": r})
            if self.dry_run or self.round_policy(arm, seed, r) is None:  # a dry run shows round 0's two commands
                runs = ", ".join(f"'{x}'" for x in self.round_runs(arm, seed, r))
                self._train_job(arm, seed, "bc", self.round_dir(arm, seed, r),
                                self._bc_options(h, f"run_id IN ({runs}) AND success"))
                if self.dry_run:
                    return

    def run_online(self, seed: int, arm: str = "online_grpo") -> None:
        """``halo-train online-grpo`` with the arm's hyperparameters as its options (each one a flag of that
        command: ``epochs_per_update: 2`` is ``--epochs-per-update 2``), resumed where it stopped."""
        if self.final_adapter(arm, seed) is not None:
            return
        h = dict(self.p.hyperparameters[arm])
        out = self.adapter_dir(arm, seed)
        i, lora = self.p.interface, self.p.hyperparameters["lora"]
        dev = self.p.splits["dev"]
        argv = [str(BIN / "halo-train"), "online-grpo", "--base-model", self.base_model, "--serve", "--engine", "chat",
                "--tasks", ",".join(self.p.tasks(self.p.train_tasks)), "--lake", str(self.lake), "--output-dir", str(out),
                "--run-id", self.p.online_run(seed, arm), "--seed", str(seed),
                "--train-seed-start", str(self.p.train_seed_start(seed))]
        for key, value in h.items():
            argv += _flag(key, value)
        argv += ["--lora-r", str(lora["r"]), "--lora-alpha", str(lora["alpha"]),
                 "--temperature", str(i["temperature"]), "--max-episode-steps", str(i["max_steps"]),
                 "--observation", i["observation"], "--reward-config", self._path(i["reward_config"]), "--no-progress",
                 "--constrain-actions" if i["constrain_actions"] else "--no-constrain-actions"]
        env_options = self.p.env_options()
        if env_options:
            argv += ["--env-options", ",".join(f"{key}={value}" for key, value in env_options.items())]
        every = self.p.hyperparameters.get("curve", {}).get(f"{arm}_every")
        if seed == self.p.training_seeds[0] and every:
            argv += ["--eval-every", str(every), "--eval-tasks", ",".join(self.p.tasks(self.p.heldout_tasks)),
                     "--eval-seed-start", str(dev["curve_first"]), "--eval-seeds", str(dev["curve_seeds"]), "--eval-attempts", "1"]
        if (out / "online_run.json").exists():
            argv.append("--resume")
        self._call(argv, f"{arm}-s{seed}", {"kind": "train", "arm": arm, "seed": seed, "run_id": self.p.online_run(seed, arm)})

    def run_trained_evals(self, seed: int, arms: list[str]) -> None:
        """Each trained arm's evaluation cells, only for arms whose training is final."""
        ready = {arm: self.final_adapter(arm, seed) for arm in arms}
        todo = {arm: self.missing(self.p.eval_cells(arm, seed)) for arm, final in ready.items() if final is not None}
        todo = {arm: cells for arm, cells in todo.items() if cells}
        if not todo:
            return
        names = {arm: None if ready[arm] == BASE_MODEL else f"{arm}-s{seed}" for arm in todo}
        with self.engine({names[arm]: str(ready[arm]) for arm in todo if names[arm]}) as url:
            for arm, cells in todo.items():
                adapter = None if ready[arm] == BASE_MODEL else str(ready[arm])
                for cell in cells:
                    self.evaluate(cell, [*self.model_policy(url, names[arm]), "--mode", arm], adapter)

    def train_stage(self, arm: str):
        method = self.p.method(arm)
        return {"bc": self.run_bc, "dpo": self.run_dpo, "expert_iteration": self.run_expert_iteration,
                "online": self.run_online}[method]

    @staticmethod
    def _stage(stage, *args: Any) -> None:
        """One stage; a failed command leaves the stages after it to run (its log says why; the next run retries).
        A stage the records refuse stops the run: nothing after it may run either."""
        try:
            stage(*args)
        except RuntimeError as e:
            if isinstance(e, ExperimentError):
                raise
            log.error("%s%s: %s", stage.__name__, args, e)

    def run(self, arms: list[str] | None = None, seeds: list[int] | None = None) -> None:
        if self.enforce:
            self.p.check_prompt_version()
            self.records.check(self.p)
        self.drop_unstarted()
        arms = arms or list(self.p.arms)
        seeds = [s for s in self.p.training_seeds if seeds is None or s in seeds]
        for arm in arms:
            if self.p.arms.get(arm, {}).get("kind") == "policy":
                self._stage(self.run_policy_arm, arm)
        if "zero_shot" in arms and "zero_shot" in self.p.arms:
            self._stage(self.run_zero_shot)
        trained = [a for a in self.p.trained_arms() if a in arms]
        for seed in seeds:
            if any(self.p.method(a) in ("bc", "dpo") for a in trained):
                self._stage(self.run_sample, seed)
            # Each arm is evaluated as soon as its training is final, so an interrupted experiment has every
            # finished arm's results (the evaluation is the same whenever it runs).
            for arm in trained:
                self._stage(self.train_stage(arm), seed, arm)
                self._stage(self.run_trained_evals, seed, [arm])

    def drop_unstarted(self) -> None:
        """Episodes whose environment failed before the policy acted tested no policy: they are removed (and the
        removal recorded) so that their cells resume and run them. HALO's rollouts stop rather than write such an
        episode (``halo_agent.rollout.episode.ResetFailedError``); older versions wrote them as failed attempts."""
        lake = None if self.dry_run else self.state.open()
        if lake is None:
            return
        from halo_data.ops import drop_unstarted_episodes

        for run_id, dropped in drop_unstarted_episodes(lake).items():
            log.warning("%s: %d episodes whose environment failed before the policy acted removed; the cell "
                        "resumes and runs them", run_id, len(dropped))
            self.records.append({"stage": run_id, "run_id": run_id, "event": "dropped_unstarted",
                                 "episodes": len(dropped), "episode_ids": dropped, "at": now()})

    # ------------------------------------------------------------------ status
    def status(self) -> list[StageStatus]:
        """Every stage of the plan and how far it is; the lake is read once for all runs' episodes."""
        stages: list[StageStatus | tuple[str, int]] = []  # a training's status, or (a run, its episodes planned)
        for arm in self.p.arms:
            for seed in self.p.arm_seeds(arm):
                if self.p.arms[arm]["kind"] == "trained":
                    if self.p.method(arm) == "online":  # how far its iterations are
                        its = self.state.online_iterations(self.p.online_run(seed, arm))
                        total = int(self.p.hyperparameters[arm]["iterations"])
                        stages.append(StageStatus(f"train {arm} s{seed}", min(len(its), total), total, "iterations",
                                                  iterations_note(its, total)))
                    else:
                        done = self.final_adapter(arm, seed) is not None
                        stages.append(StageStatus(f"train {arm} s{seed}", int(done), 1, "job",
                                                  "" if done else self.job_note(arm, seed)))
                    stages += [(self.p.round_run(arm, seed, r), self.p.round_episodes(arm)) for r in range(self.p.rounds(arm))]
                stages += [(cell.run_id, cell.episodes) for cell in self.p.eval_cells(arm, seed)]
        if any(self.p.method(a) in ("bc", "dpo") for a in self.p.trained_arms()):
            stages += [(self.p.sample_run(seed), self.p.sample_episodes) for seed in self.p.training_seeds]
        there = self.state.episode_counts([s[0] for s in stages if isinstance(s, tuple)])
        return [s if isinstance(s, StageStatus) else StageStatus(s[0], there.get(s[0], 0), s[1]) for s in stages]
