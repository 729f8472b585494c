import importlib
import sys

# python -m bench NAME [options]: one measurement each; no name runs the lake's speed and memory suite (bench/run.py).
COMMANDS = {
    "online": ("bench.online", "online GRPO: held-out success of start, random and final"),
    "choice-probe": ("bench.choice_probe", "supervised on an online run's covered states: can the model learn the right choice"),
    "state-groups": ("bench.state_groups", "online GRPO by state vs by episode: trainable groups, seconds per iteration"),
    "online-pipeline": ("bench.online_pipeline", "online GRPO sequential vs --pipeline: seconds per iteration"),
    "online-learner": ("bench.online_learner", "online GRPO: a job per update against the persistent learner (omega 1 and 0)"),
    "learner-minibatch": ("bench.learner_minibatch", "the persistent learner at 8 rows an optimizer step against 4, three training seeds (bench/protocols/learner-minibatch.md)"),
    "learner-kl-guard": ("bench.learner_kl_guard", "the persistent learner at 4 rows an optimizer step with --target-kl 0.02 against its default, three training seeds (bench/protocols/learner-kl-guard.md)"),
    "learner-warmup": ("bench.learner_warmup", "the persistent learner at 4 rows an optimizer step with --target-kl 0.02 and --warmup-steps 16 against its default, three training seeds (bench/protocols/learner-warmup.md)"),
    "adam-steps": ("bench.adam_steps", "how far AdamW moves the weights per update, fresh per update (a job) against kept across updates"),
    "ray": ("bench.ray_rollout", "Ray workers against the local pool"),
    "os": ("bench.os_env", "the os environment's sandbox and rollout speed"),
    "os-sandbox": ("bench.os_sandbox", "the os sandbox's start, against an earlier revision's, side by side"),
    "os-ppo": ("bench.os_ppo", "os PPO against SFT on the same seeds, on unseen seeds and tasks"),
    "vlm": ("bench.vlm", "image tokens per step and peak memory of a VLM job"),
    "hierarchy": ("bench.hierarchy", "the verified action cache and loop recovery"),
    "search": ("bench.search", "MCTS against best-of-N at one env-step budget"),
    "learning": ("bench.learning", "the pre-registered learning experiment (run, status, export; bench/protocols/)"),
    "serving": ("bench.serving", "HALO's chat server on constrained rollouts: cached scoring against the full one, steps/s"),
    "engine-batch": ("bench.engine_batch", "the chat server's padded decode step at batch 1, 2, 4, 8 under torch's and oneDNN's linear kernels"),
    "ratios": ("bench.ratios", "first-update importance ratios of served rows: --engine server | hf | vllm"),
    "browser": ("bench.browser", "headless Chromium: Debian's full browser against its headless shell, CPU per launch and episode"),
    "suite-time": ("bench.suite_time", "the whole test suite's wall time (the README's command), with the load beside it"),
    "task-progress": ("bench.task_progress", "task-aware vs milestone progress: partial solution against random clicking"),
    "quickstart": ("bench.quickstart", "halo-train quickstart --model as a user runs it: wall and CPU time, held-out success with intervals"),
    "omp-wait": ("bench.omp_wait", "a LoRA training step under libgomp's default spin, PASSIVE and a short spin, alone and beside a neighbour"),
    "element-descriptions": ("bench.element_descriptions", "zero-shot success with unnamed elements described (--observation elements) against not (elements-v2)"),
    "element-descriptions-bc": ("bench.element_descriptions_bc", "BC on a teacher's successes (random's: the same episodes; --teacher goal_match: the rule's) with and without the descriptions of unnamed elements"),
    "element-descriptions-online": ("bench.element_descriptions_online", "online GRPO with and without the descriptions of unnamed elements, then the test seeds"),
    "miniwob-settle": ("bench.miniwob_settle", "MiniWoB++ episodes answered at once and slowly: the settle wait after each action against none"),
    "view-order": ("bench.view_order", "a training read's one row order (ORDER BY ALL) against DuckDB's own, lake-wide and run-scoped, as the lake grows"),
    "delta-log": ("bench.delta_log", "a table's Delta log as commits add up (checkpoints, commits), and what vacuum keeps: bytes and open seconds"),
    "lake-growth": ("bench.lake_growth", "an online iteration's reads, query cold start and dashboard as the lake grows to 5M steps"),
}

if __name__ == "__main__":
    if sys.argv[1:2] == ["report"]:  # the tables of docs/benchmarks.md, from bench/results/ (bench/reports/)
        from bench.reports import main as report_main

        sys.exit(report_main(sys.argv[2:]))
    if sys.argv[1:2] and sys.argv[1] in COMMANDS:
        importlib.import_module(COMMANDS[sys.argv[1]][0]).main(sys.argv[2:])
    else:
        if sys.argv[1:2] in (["-h"], ["--help"]):
            print("Other benchmarks: python -m bench NAME [--help], NAME one of:\n" + "".join(
                f"  {name:<14} {what}\n" for name, (_, what) in COMMANDS.items())
                + "Their tables: python -m bench report [NAME] [--write] (docs/benchmarks.md)\n")
        from bench.run import main

        main()
