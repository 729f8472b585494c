"""A pre-registered learning experiment (bench/protocols/learning-v1.yaml), driven through HALO's own commands.

    .venv/bin/python -m bench learning status                     # what is done, what is left
    nohup nice -n 15 .venv/bin/python -m bench learning run >> runs/learning-v1/run.log 2>&1 &
    .venv/bin/python -m bench learning export                     # bench/results/learning-v1/
    .venv/bin/python -m bench learning report                     # the tables and the curve (bench/reports/)

``run`` goes through the protocol's plan in order — the non-learned arms' evaluations (random, heuristic,
zero_shot), then per training seed the base model's sampling, bc_filtered, dpo and online_grpo training, and
their evaluations — and skips what is done. What is done is read from the lake (episodes per run id) and the
output folders (a final adapter, online_grpo's recorded iterations), never from memory: a killed run is
resumed by the same command, each stage through HALO's own ``--resume`` (``halo-agent rollout --resume``,
``halo-train bc/dpo --resume-from OUTPUT/checkpoint-N``, ``halo-train online-grpo --resume``). An arm's test
seeds are evaluated only once its training is final. Everything lands under ``--root`` (default
runs/learning-v1): the lake, the adapters, each command's log, ``commands.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

from bench.learning_protocol import EvalCell, Protocol, ProtocolError, load
from bench.learning_state import BASE_MODEL, LakeState

log = logging.getLogger("bench.learning")
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def resolve_base_model(name: str) -> str:
    """The base model's folder: HALO's resolver where it exists, else the model cache's folder of that name."""
    try:
        from halo_agent.models import resolve_model  # type: ignore[import-not-found]
    except ImportError:
        cached = Path(os.environ.get("HALO_MODELS", Path.home() / ".cache" / "halo" / "models")) / name
        return str(cached) if cached.exists() else name
    return resolve_model(name)


class Runner:
    """The plan of one protocol under ``root``; ``run_*`` methods each do one stage if it is not done."""

    def __init__(self, protocol: Protocol, root: str | Path, workers: int = 1, dry_run: bool = False):
        self.p = protocol
        self.root = Path(root)
        self.lake = self.root / "lake"
        self.workers = workers
        self.dry_run = dry_run
        self.base_model = resolve_base_model(protocol.base_model)
        self.served_name = Path(self.base_model).name

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> LakeState:
        return LakeState(self.lake)

    def adapter_dir(self, arm: str, seed: int) -> Path:
        return self.root / "adapters" / f"{arm}-s{seed}"

    def final_adapter(self, arm: str, seed: int) -> str | None:
        """The arm's final adapter folder once its training is complete (BASE_MODEL: it ended on the base
        model); None before."""
        out = self.adapter_dir(arm, seed)
        if arm == "online_grpo":
            return self.state.online_final(self.p.online_run(seed), int(self.p.hyperparameters["online_grpo"]["iterations"]))
        final = out / "final"
        if (final / "adapter_config.json").exists():
            return str(final)
        return BASE_MODEL if self.nothing_to_train_on(arm, seed) else None

    def sample_complete(self, seed: int) -> bool:
        """Every episode of the budget sampled: bc_filtered and dpo train on all of it, never on a part."""
        sample = self.p.budget["sample"]
        planned = len(self.p.train_tasks) * int(sample["task_seeds"]) * int(sample["attempts"])
        return self.state.episodes(self.p.sample_run(seed)) >= planned

    def nothing_to_train_on(self, arm: str, seed: int) -> bool:
        """bc_filtered without one successful sampled episode, dpo without one pair: once the sampling is complete,
        the arm has no data, so its final policy is the base model (the report's rows say so by their seeds)."""
        if not self.sample_complete(seed):
            return False
        sql = {"bc_filtered": "select count(*) AS n from episodes where run_id = $r and success",
               "dpo": "select count(*) AS n from dpo_pairs where run_id = $r and source = 'episodes'"}[arm]
        rows = self.state.query(sql, {"r": self.p.sample_run(seed)})
        return bool(rows) and int(rows[0]["n"]) == 0

    # ------------------------------------------------------------------ commands
    def _call(self, argv: list[str], log_name: str, env: dict[str, str] | None = None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        line = shlex.join(argv)
        with open(self.root / "commands.log", "a") as f:
            f.write(f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ} {line}\n")
        log.info("%s", line)
        if self.dry_run:
            return
        (self.root / "logs").mkdir(exist_ok=True)
        with open(self.root / "logs" / f"{log_name}.log", "a") as out:
            child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=ROOT)
            try:
                rc = child.wait()
            except BaseException:  # the runner is stopped (SIGTERM, Ctrl-C): stop the stage too; --resume continues it
                child.terminate()
                try:
                    child.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    child.kill()
                raise
        if rc != 0:
            raise RuntimeError(f"{argv[0]} exited {rc}: see {self.root / 'logs' / (log_name + '.log')}")

    def _interface_options(self) -> list[str]:
        i = self.p.interface
        return ["--env", i["env"], "--observation", i["observation"], "--max-steps", str(i["max_steps"]),
                "--temperature", str(i["temperature"]), "--reward-config", str(ROOT / i["reward_config"]),
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
                policy: list[str], planned: int, kind: str = "eval") -> None:
        """``halo-agent rollout`` of a run id into the lake, resumed where it exists; nothing when complete."""
        done = self.state.episodes(run_id)
        if done >= planned:
            return
        argv = [str(BIN / "halo-agent"), "rollout", "--tasks", ",".join(tasks), "--task-seed", str(first_seed),
                "--task-seeds", str(seeds), "--rollouts-per-task", str(attempts), "--seed", str(seed),
                "--run-id", run_id, *self._interface_options(), *policy]
        if done or self.state.has_run(run_id):
            argv.append("--resume")
        log.info("%s: %d of %d episodes there", run_id, done, planned)
        self._call(argv, run_id)

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

    def evaluate(self, cell: EvalCell, policy: list[str]) -> None:
        self.rollout(cell.run_id, cell.tasks, cell.first_seed, cell.seeds, cell.attempts,
                     self.p.policy_seed(cell.training_seed), policy, cell.episodes)

    # ------------------------------------------------------------------ stages
    def run_policy_arm(self, arm: str) -> None:
        for cell in self.p.eval_cells(arm, 0):
            self.evaluate(cell, self.policy_arm(arm))

    def missing(self, cells: list[EvalCell]) -> list[EvalCell]:
        return [c for c in cells if self.state.episodes(c.run_id) < c.episodes]

    def run_zero_shot(self) -> None:
        cells = self.missing(self.p.eval_cells("zero_shot", 0))
        if not cells:
            return
        with self.engine({}) as url:
            for cell in cells:
                self.evaluate(cell, [*self.model_policy(url), "--mode", "zero_shot"])

    def run_sample(self, seed: int) -> None:
        """The base model's episodes on the train task seeds of one training seed (bc_filtered's and dpo's data)."""
        sample = self.p.budget["sample"]
        planned = len(self.p.train_tasks) * int(sample["task_seeds"]) * int(sample["attempts"])
        run_id = self.p.sample_run(seed)
        if self.sample_complete(seed):
            return
        with self.engine({}) as url:
            self.rollout(run_id, self.p.tasks(self.p.train_tasks), self.p.train_seed_start(seed), int(sample["task_seeds"]),
                         int(sample["attempts"]), seed, [*self.model_policy(url), "--mode", "sample"], planned, kind="rollout")

    def _train_job(self, arm: str, seed: int, job: str, extra: list[str]) -> None:
        if self.final_adapter(arm, seed) is not None:
            if self.final_adapter(arm, seed) == BASE_MODEL:
                log.warning("%s seed %d: nothing to train on in %s: the base model stands for it", arm, seed, self.p.sample_run(seed))
            return
        if not self.sample_complete(seed) and not self.dry_run:
            log.warning("%s seed %d waits for the whole sample %s", arm, seed, self.p.sample_run(seed))
            return
        out = self.adapter_dir(arm, seed)
        lora = self.p.hyperparameters["lora"]
        argv = [str(BIN / "halo-train"), job, "--lake", str(self.lake), "--base-model", self.base_model,
                "--output-dir", str(out), "--seed", str(seed), "--lora-r", str(lora["r"]), "--lora-alpha", str(lora["alpha"]),
                "--adapter-name", arm, "--save-steps", "4", *extra]
        checkpoints = sorted(out.glob("checkpoint-*"), key=lambda c: int(c.name.rsplit("-", 1)[1]))
        if checkpoints:
            argv += ["--resume-from", str(checkpoints[-1])]
        self._call(argv, f"{arm}-s{seed}")

    def run_bc(self, seed: int) -> None:
        h = self.p.hyperparameters["bc_filtered"]
        self._train_job("bc_filtered", seed, "bc", [
            "--where", f"run_id = '{self.p.sample_run(seed)}' AND success", "--top-percent", "100",
            "--max-steps", str(h["max_steps"]), "--batch-size", str(h["batch_size"]), "--lr", str(h["lr"]),
            "--lora-dropout", str(h["lora_dropout"])])

    def run_dpo(self, seed: int) -> None:
        h = self.p.hyperparameters["dpo"]
        self._train_job("dpo", seed, "dpo", [
            "--where", f"run_id = '{self.p.sample_run(seed)}'", "--source", "episodes",
            "--max-steps", str(h["max_steps"]), "--batch-size", str(h["batch_size"]), "--lr", str(h["lr"]),
            "--beta", str(h["beta"]), "--loss-type", h["loss_type"], "--lora-dropout", str(h["lora_dropout"])])

    def run_online(self, seed: int) -> None:
        h = self.p.hyperparameters["online_grpo"]
        if self.final_adapter("online_grpo", seed) is not None:
            return
        out = self.adapter_dir("online_grpo", seed)
        i, lora = self.p.interface, self.p.hyperparameters["lora"]
        curve = self.p.hyperparameters.get("curve", {})
        dev = self.p.splits["dev"]
        argv = [str(BIN / "halo-train"), "online-grpo", "--base-model", self.base_model, "--serve", "--engine", "chat",
                "--tasks", ",".join(self.p.tasks(self.p.train_tasks)), "--lake", str(self.lake), "--output-dir", str(out),
                "--run-id", self.p.online_run(seed), "--seed", str(seed), "--train-seed-start", str(self.p.train_seed_start(seed)),
                "--iterations", str(h["iterations"]), "--seeds-per-iteration", str(h["seeds_per_iteration"]),
                "--group-size", str(h["group_size"]), "--group-by", h["group_by"], "--train-steps", str(h["train_steps"]),
                "--batch-size", str(h["batch_size"]), "--lr", str(h["lr"]), "--loss-type", h["loss_type"],
                "--beta", str(h["beta"]), "--epsilon", str(h["epsilon"]), "--max-staleness", str(h["max_staleness"]),
                "--replay-iterations", str(h["replay_iterations"]), "--lora-r", str(lora["r"]), "--lora-alpha", str(lora["alpha"]),
                "--temperature", str(i["temperature"]), "--max-episode-steps", str(i["max_steps"]),
                "--observation", i["observation"], "--reward-config", str(ROOT / i["reward_config"]), "--no-progress",
                "--constrain-actions" if i["constrain_actions"] else "--no-constrain-actions",
                "--cover-choices" if h.get("cover_choices") else "--no-cover-choices"]
        if seed == self.p.training_seeds[0] and curve.get("online_grpo_every"):
            argv += ["--eval-every", str(curve["online_grpo_every"]), "--eval-tasks", ",".join(self.p.tasks(self.p.heldout_tasks)),
                     "--eval-seed-start", str(dev["curve_first"]), "--eval-seeds", str(dev["curve_seeds"]), "--eval-attempts", "1"]
        if (out / "online_run.json").exists():
            argv.append("--resume")
        self._call(argv, f"online_grpo-s{seed}")

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
                for cell in cells:
                    self.evaluate(cell, [*self.model_policy(url, names[arm]), "--mode", arm])

    @staticmethod
    def _stage(stage, *args: Any) -> None:
        """One stage; a failed command leaves the stages after it to run (its log says why; the next run retries)."""
        try:
            stage(*args)
        except RuntimeError as e:
            log.error("%s%s: %s", stage.__name__, args, e)

    def run(self, arms: list[str] | None = None, seeds: list[int] | None = None) -> None:
        arms = arms or list(self.p.arms)
        seeds = [s for s in self.p.training_seeds if seeds is None or s in seeds]
        for arm in ("random", "heuristic"):
            if arm in arms and arm in self.p.arms:
                self._stage(self.run_policy_arm, arm)
        if "zero_shot" in arms:
            self._stage(self.run_zero_shot)
        trained = [a for a in self.p.arms if self.p.arms[a]["kind"] == "trained" and a in arms]
        for seed in seeds:
            if {"bc_filtered", "dpo"} & set(trained):
                self._stage(self.run_sample, seed)
            # Each arm is evaluated as soon as its training is final, so an interrupted experiment has every
            # finished arm's results (the evaluation is the same whenever it runs).
            for arm, stage in (("bc_filtered", self.run_bc), ("dpo", self.run_dpo), ("online_grpo", self.run_online)):
                if arm in trained:
                    self._stage(stage, seed)
                    self._stage(self.run_trained_evals, seed, [arm])

    # ------------------------------------------------------------------ status
    def status(self) -> list[dict[str, Any]]:
        rows = []
        for arm in self.p.arms:
            for seed in self.p.arm_seeds(arm):
                if self.p.arms[arm]["kind"] == "trained":
                    rows.append({"stage": f"train {arm} s{seed}", "done": self.final_adapter(arm, seed) is not None})
                for cell in self.p.eval_cells(arm, seed):
                    rows.append({"stage": cell.run_id, "done": f"{self.state.episodes(cell.run_id)}/{cell.episodes}"})
        for seed in self.p.training_seeds:
            sample = self.p.budget["sample"]
            planned = len(self.p.train_tasks) * int(sample["task_seeds"]) * int(sample["attempts"])
            rows.append({"stage": self.p.sample_run(seed), "done": f"{self.state.episodes(self.p.sample_run(seed))}/{planned}"})
        return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench learning", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["run", "status", "export", "report"])
    ap.add_argument("--protocol", default="learning-v1", help="a protocol name under bench/protocols or a file")
    ap.add_argument("--root", default=None, help="where the lake, adapters and logs go (default runs/NAME)")
    ap.add_argument("--results", default=None, help="export: the results folder (default bench/results/NAME)")
    ap.add_argument("--arms", default=None, help="run: only these arms, comma-separated")
    ap.add_argument("--seeds", default=None, help="run: only these training seeds, comma-separated")
    ap.add_argument("--workers", type=int, default=1, help="rollout worker processes (browsers)")
    ap.add_argument("--dry-run", action="store_true", help="run: print the commands instead of running them")
    args = ap.parse_args(argv)
    # SIGTERM (kill PID) ends the runner as Ctrl-C would: the running stage and the engine are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        protocol = load(args.protocol)
    except ProtocolError as e:
        sys.exit(f"Error: {e}")
    root = Path(args.root or ROOT / "runs" / protocol.name)
    runner = Runner(protocol, root, workers=args.workers, dry_run=args.dry_run)
    if args.command == "status":
        for row in runner.status():
            print(f"{row['stage']:<48} {row['done']}")
    elif args.command == "report":
        from bench.reports import learning_v1  # a protocol's results have learning-v1's shape whatever its name

        print(learning_v1.report(Path(args.results or ROOT / "bench" / "results" / protocol.name)))
    elif args.command == "export":
        from bench.learning_export import export

        results = Path(args.results or ROOT / "bench" / "results" / protocol.name)
        print(export(runner, results))
    else:
        runner.run(arms=args.arms.split(",") if args.arms else None,
                   seeds=[int(s) for s in args.seeds.split(",")] if args.seeds else None)


if __name__ == "__main__":
    main()
