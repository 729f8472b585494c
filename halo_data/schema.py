"""The lake's tables, their columns and partition keys — documented in one place.

Every writer builds Arrow tables against these schemas and every reader projects
files onto them, so a column added here becomes NULL for data written by an older
HALO (schema evolution without rewriting anything).

Format version 2. Bump ``FORMAT_VERSION`` only for changes an older reader cannot
survive (a renamed or retyped column, a new layout); adding a nullable column is not one.
Version 1 partitioned ``steps``, ``candidates`` and ``mcts_nodes`` by run as well as env: a
folder per run, so at least one file per run that a query's cold start opened, however small
the runs. Version 2 partitions them by env alone; a run-scoped read finds its runs' files by
their run_id statistics and compaction packs many runs into one file. This HALO reads and
writes both; ``halo-data upgrade`` rewrites a version 1 lake into version 2.
"""

from __future__ import annotations

import dataclasses
import functools

import pyarrow as pa

FORMAT_VERSION = 2
STATE_HASH_VERSION = 1

TS = pa.timestamp("us", tz="UTC")


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str


@dataclasses.dataclass(frozen=True)
class TableSpec:
    name: str
    doc: str
    partition_by: tuple[str, ...]
    columns: tuple[Column, ...]

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.type, nullable=True) for c in self.columns])

    @functools.cached_property
    def _names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def column_names(self) -> list[str]:
        return list(self._names)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)


def C(name: str, type_: pa.DataType, doc: str) -> Column:
    return Column(name, type_, doc)


# Reward components stored raw on each step, in column ``r_<name>`` of ``steps``; the shaped
# reward is their weighted sum. The one declaration of the components: everything else derives from it.
_REWARD_COMPONENT_DOCS = {
    "progress": "Dense progress reward component.",
    "novelty": "Novelty bonus component (new state).",
    "loop": "Loop penalty component (repeated action/state), <= 0.",
    "validity": "Validity shaping component.",
    "success": "Success component: the environment's reward on the final step.",
    "task_progress": (
        "Task-aware progress: the change at this step of the share of the task's expectations "
        "(halo_agent.task_progress) that the site's /finish state satisfies; an episode's values sum "
        "to its final share. NULL where the task has no expectations (nothing was measured)."
    ),
}
REWARD_COMPONENTS: tuple[str, ...] = tuple(_REWARD_COMPONENT_DOCS)


def reward_column(component: str) -> str:
    """The ``steps`` column of a reward component: ``progress`` -> ``r_progress``."""
    return f"r_{component}"


REWARD_COLUMNS: tuple[str, ...] = tuple(reward_column(c) for c in REWARD_COMPONENTS)


# Token-exact steps: what a model-generated completion was, token by token, and which distribution its logprobs
# are of, so a trainer scores exactly those tokens under exactly that distribution. Shared by steps and candidates.
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
DRAWS = ("masked_choice", "sequence_choice", "sample", "greedy")
LOGPROBS_DOC = (
    "One logprob per token of completion_token_ids (the same length), of the distribution logprobs_mode and draw "
    "name: under processed_logprobs the one the engine drew the token from (masked_choice: the allowed tokens' "
    "probabilities renormalised at the temperature, 0 for a token every remaining choice shares; sample: the "
    "softmax at the temperature, top_p applied), under raw_logprobs the model's softmax at temperature 1. Rows "
    "without completion_token_ids (older HALO, endpoints that return no token ids): per-token logprobs of "
    "model_output as the endpoint reported them, raw softmax unless it says otherwise."
)
TOKEN_COLUMNS = (
    C("completion_token_ids", pa.list_(pa.int64()),
      "The token ids the engine generated for model_output, in order, EOS included where the engine returned it "
      "(vLLM's return_tokens_as_token_ids); trainers score these ids, never a re-tokenisation of the text. NULL "
      "where the policy is not a model or its endpoint returns no token ids (and in lakes of an older HALO)."),
    C("logprobs_mode", pa.string(),
      "Which distribution logprobs are of: processed_logprobs (the one the engine drew from: masking, temperature "
      "and top_p applied; vLLM's --logprobs-mode processed_logprobs) | raw_logprobs (the model's raw softmax). "
      "NULL where the policy reports no logprobs, and in lakes of an older HALO (whose logprobs are the raw softmax)."),
    C("draw", pa.string(),
      "How the completion was drawn: masked_choice (a guided choice drawn token by token under the grammar mask "
      "over choices, as vLLM does) | sequence_choice (a guided choice drawn by whole-sequence probability) | "
      "sample (sampled at the temperature) | greedy (temperature 0). NULL where unknown (older HALO)."),
    C("choices", pa.list_(pa.string()),
      "The answers decoding was constrained to (the guided choice's list, in the order sent), which a trainer "
      "needs to rebuild a masked_choice draw's mask; NULL for unconstrained decoding. A covered choice (openai "
      "policy, cover_choices) carries the page's choices and its tokens, and no logprobs under processed_logprobs: "
      "its one-choice request forced every token."),
)


RUNS = TableSpec(
    name="runs",
    doc="One row per run (rollout, eval or training). Upserted by run_id: a resumed run keeps its row.",
    partition_by=(),
    columns=(
        C("run_id", pa.string(), "Unique id of the run; [A-Za-z0-9._-] only."),
        C("kind", pa.string(), "rollout | eval | train."),
        C("mode", pa.string(), "Named policy configuration (eval modes) or the training job type."),
        C("env", pa.string(), "miniwob | real (rollouts); NULL for training runs."),
        C("policy", pa.string(), "random | openai | hf."),
        C("model", pa.string(), "Model name or path the policy used."),
        C("adapter", pa.string(), "LoRA adapter name or folder, if any."),
        C("policy_version", pa.string(), "Version tag of the policy weights (adapter id, training step)."),
        C("split", pa.string(), "train | eval | all: which split of the task registry the run used."),
        C("task_version", pa.string(), "REAL task version (v2 by default)."),
        C("config", pa.string(), "The run's full configuration as JSON (secrets redacted)."),
        C("command", pa.string(), "The command line that started the run (secrets redacted)."),
        C("planned_episodes", pa.int64(), "Episodes the run planned (tasks x rollouts per task)."),
        C("status", pa.string(), "running | finished | failed | interrupted."),
        C("started_at", TS, "When the run started."),
        C("ended_at", TS, "When the run ended (NULL while running)."),
        C("provenance", pa.string(), "JSON: package versions, git sha, host, python; never secrets."),
        C("job_type", pa.string(), "bc | dpo | grpo (training runs)."),
        C("base_model", pa.string(), "Base model of a training run."),
        C("source_view", pa.string(), "View a training run read."),
        C("lineage", pa.string(), "JSON {table: version} of every lake table a training run read."),
        C("output_dir", pa.string(), "Where a training run wrote its adapters."),
    ),
)

STEPS = TableSpec(
    name="steps",
    doc=(
        "One row per agent step, carrying its episode's fields so one append commits whole "
        "episodes atomically. Partitioned by env; a run's rows stay together within files."
    ),
    partition_by=("env",),
    columns=(
        # --- the episode (repeated on each of its steps) ---
        C("run_id", pa.string(), "Run that produced the episode (file statistics: run-scoped reads open its files only)."),
        C("env", pa.string(), "miniwob | real (partition key)."),
        C("episode_id", pa.string(), "Deterministic id from (run_id, task_id, task_seed, attempt_idx)."),
        C("task_id", pa.string(), "Task id, e.g. miniwob.click-button or v2.gomail-1."),
        C("site", pa.string(), "Site of the task (gomail, omnizon, ..., miniwob)."),
        C("task_version", pa.string(), "REAL task version; NULL for MiniWoB."),
        C("split", pa.string(), "train | eval | all."),
        C("mode", pa.string(), "Named policy configuration."),
        C("policy", pa.string(), "random | openai | hf."),
        C("model", pa.string(), "Model name or path."),
        C("adapter", pa.string(), "LoRA adapter, if any."),
        C("policy_version", pa.string(), "Version tag of the policy weights."),
        C("attempt_idx", pa.int32(), "Attempt index of this task within the run."),
        C("seed", pa.int64(), "Seed of the policy's sampling."),
        C("task_seed", pa.int64(), "Seed of the task instance."),
        C("temperature", pa.float64(), "Sampling temperature."),
        C("success", pa.bool_(), "Did the environment's own evaluator call the episode a success."),
        C("task_reward", pa.float64(), "Environment reward at the end (0/1 for BrowserGym)."),
        C("raw_reward", pa.float64(), "Environment's raw reward (MiniWoB raw_reward; may be fractional)."),
        C("n_steps", pa.int32(), "Number of actions taken in the episode."),
        C("terminated", pa.bool_(), "The task ended (done)."),
        C("truncated", pa.bool_(), "Stopped by max_steps or a time limit."),
        C("error", pa.string(), "Episode-level error (browser crash, environment failure), NULL if none."),
        C("error_kind", pa.string(), "env | policy | api | NULL."),
        C("started_at", TS, "Episode start."),
        C("ended_at", TS, "Episode end."),
        # --- the step ---
        C("step_idx", pa.int32(), "0-based index of the step in its episode."),
        C("url", pa.string(), "Page URL the action was chosen on."),
        C("goal", pa.string(), "Task goal text."),
        C("observation", pa.string(), "Observation text (AXTree) the policy saw."),
        C("screenshot_hash", pa.string(), "sha256 of the screenshot before the action (key into screenshots)."),
        C("screenshot_after_hash", pa.string(), "sha256 of the screenshot after the action."),
        C("prompt", pa.string(), "Chat messages as JSON, from the versioned prompt renderer; images by hash."),
        C("prompt_version", pa.string(), "Version of the prompt renderer."),
        C("prompt_hash", pa.string(), "sha256 of prompt; equal prompts join in dpo_pairs."),
        C("model_output", pa.string(), "Raw model output (or the canonical action text for non-model policies)."),
        C("action", pa.string(), "Parsed action as a BrowserGym action string; NULL if unparseable."),
        C("action_source", pa.string(), "worker | manager | cache | macro | recovery | random | model."),
        C("macro", pa.string(), "Name of the macro a step with action_source 'macro' was expanded from."),
        C("action_valid", pa.bool_(), "The action parsed and executed without error."),
        C("parse_error", pa.string(), "Why the model output did not parse, if it did not."),
        C("action_error", pa.string(), "Error the browser raised executing the action."),
        *(C(reward_column(name), pa.float64(), doc) for name, doc in _REWARD_COMPONENT_DOCS.items()),
        C("reward", pa.float64(), "Weighted sum of the components with the weights at collection time."),
        C("reward_weights", pa.string(), "JSON of the weights used for `reward`."),
        C("cumulative_progress", pa.float64(), "Progress reached so far in the episode (0..1)."),
        C("state_hash", pa.string(), "Identity of the page state the action was chosen on (URL + observation)."),
        C("state_hash_version", pa.int32(), "Version of the state_hash function."),
        C("latency_ms", pa.float64(), "Policy latency for this step."),
        C("env_ms", pa.float64(), "Environment time for this step."),
        C("prompt_tokens", pa.int64(), "Prompt tokens (model policies)."),
        C("completion_tokens", pa.int64(), "Completion tokens (model policies)."),
        C("call_model", pa.string(), "Model whose call produced this row (the worker's or the manager's); NULL without a model call."),
        C("cost_usd", pa.float64(), "Estimated cost of this row's model call from the price table at collection time."),
        C("logprobs", pa.list_(pa.float64()), LOGPROBS_DOC),
        C("logprob_sum", pa.float64(), "Sum of logprobs: the log-probability of the completion under the distribution they are of."),
        *TOKEN_COLUMNS,
        C("is_last", pa.bool_(), "Last step of the episode."),
        C("extra", pa.string(), "JSON for anything else (env info, MiniWoB rewards)."),
    ),
)

SCREENSHOTS = TableSpec(
    name="screenshots",
    doc="One row per distinct image, content-addressed by sha256; partitioned by the hash's first hex digit.",
    partition_by=("hash_prefix",),
    columns=(
        C("hash_prefix", pa.string(), "First hex digit of hash (partition key)."),
        C("hash", pa.string(), "sha256 of the image bytes."),
        C("image", pa.binary(), "PNG or WebP bytes."),
        C("format", pa.string(), "png | webp | jpeg."),
        C("width", pa.int32(), "Pixels."),
        C("height", pa.int32(), "Pixels."),
        C("created_at", TS, "When first stored."),
    ),
)

CANDIDATES = TableSpec(
    name="candidates",
    doc="N actions sampled and scored at one state (online GRPO, MCTS); partitioned by env.",
    partition_by=("env",),
    columns=(
        C("run_id", pa.string(), "Run (file statistics: run-scoped reads open its files only)."),
        C("env", pa.string(), "Environment (partition key)."),
        C("episode_id", pa.string(), "Episode the state belongs to."),
        C("task_id", pa.string(), "Task id."),
        C("step_idx", pa.int32(), "Step of the episode at which the candidates were sampled."),
        C("state_hash", pa.string(), "State the candidates were sampled at."),
        C("candidate_idx", pa.int32(), "Index of the sample."),
        C("prompt", pa.string(), "Chat messages JSON."),
        C("prompt_hash", pa.string(), "sha256 of prompt."),
        C("model_output", pa.string(), "Raw sampled output."),
        C("action", pa.string(), "Parsed action, NULL if unparseable."),
        C("score", pa.float64(), "Score of the candidate (critic, rollout value, or env reward); NULL when its state did not reproduce."),
        C("score_source", pa.string(), "critic | rollout | env | unreproducible (the state did not restore: never trained on)."),
        C("policy_version", pa.string(), "Policy that sampled it."),
        C("logprob_sum", pa.float64(), "Behaviour logprob of the sample (the sum of logprobs where they are stored), where known."),
        C("created_at", TS, "When sampled."),
        C("logprobs", pa.list_(pa.float64()), LOGPROBS_DOC),
        *TOKEN_COLUMNS,
        C("temperature", pa.float64(), "Sampling temperature of the call that drew the sample."),
    ),
)

MCTS_NODES = TableSpec(
    name="mcts_nodes",
    doc="Search-tree nodes (Agent Q-style MCTS), one commit per whole tree; partitioned by env.",
    partition_by=("env",),
    columns=(
        C("run_id", pa.string(), "Run (file statistics: run-scoped reads open its files only)."),
        C("env", pa.string(), "Environment (partition key)."),
        C("tree_id", pa.string(), "One tree per (task, seed) search."),
        C("node_id", pa.string(), "Node id, unique in its tree: the child indices from the root (0, 0.2, 0.2.1)."),
        C("parent_id", pa.string(), "Parent node id; NULL for the root."),
        C("task_id", pa.string(), "Task id."),
        C("depth", pa.int32(), "Depth from the root."),
        C("action", pa.string(), "Action from the parent to this node."),
        C("visits", pa.int64(), "Visit count."),
        C("q_mcts", pa.float64(), "Monte Carlo value estimate."),
        C("q_critic", pa.float64(), "Critic (AI feedback) value estimate."),
        C("q", pa.float64(), "Blended value used for selection."),
        C("state_hash", pa.string(), "State at the node."),
        C("replay_prefix", pa.list_(pa.string()), "Actions from the root that reproduce the node's state."),
        C("terminal", pa.bool_(), "Terminal node."),
        C("reward", pa.float64(), "Environment reward at the node, if terminal."),
        C("created_at", TS, "When written."),
        C("task_seed", pa.int64(), "Seed of the task instance the tree searched."),
        C("model_output", pa.string(), "Raw policy output the action was parsed from."),
        C("logprob_sum", pa.float64(), "Generation logprob of model_output under the policy that sampled it, where known."),
        C("critic_rank", pa.int32(), "Rank the critic gave the action among its siblings (1 = best)."),
        C("goal", pa.string(), "Task goal."),
        C("url", pa.string(), "Page URL at the node."),
        C("prompt", pa.string(), "Chat messages JSON the policy sees at the node (its children were sampled from it)."),
        C("prompt_hash", pa.string(), "sha256 of prompt."),
        C("screenshot_hash", pa.string(), "Screenshot at the node (key into screenshots)."),
        C("action_error", pa.string(), "Error the browser raised executing the action."),
        C("reproducible", pa.bool_(), "False when replaying the prefix did not give the recorded states: never trained on."),
        C("restore_error", pa.string(), "Why the node did not reproduce."),
        C("policy_version", pa.string(), "Policy that sampled the actions."),
        C("logprobs", pa.list_(pa.float64()), LOGPROBS_DOC),
        *TOKEN_COLUMNS,
        C("temperature", pa.float64(), "Sampling temperature of the call that drew model_output."),
    ),
)

TRAIN_METRICS = TableSpec(
    name="train_metrics",
    doc="Training metrics in long form (step, metric, value); partitioned by training run.",
    partition_by=("run_id",),
    columns=(
        C("run_id", pa.string(), "Training run (partition key)."),
        C("step", pa.int64(), "Optimizer step."),
        C("epoch", pa.float64(), "Fractional epoch."),
        C("metric", pa.string(), "Namespaced metric name: loss, rewards/chosen, frac_reward_zero_std, ..."),
        C("value", pa.float64(), "Metric value."),
        C("logged_at", TS, "When logged."),
    ),
)

TABLES: dict[str, TableSpec] = {
    t.name: t for t in (RUNS, STEPS, SCREENSHOTS, CANDIDATES, MCTS_NODES, TRAIN_METRICS)
}

# Episode-level columns of `steps` (identical on every step of an episode).
EPISODE_COLUMNS: tuple[str, ...] = tuple(
    c.name for c in STEPS.columns[: [c.name for c in STEPS.columns].index("step_idx")]
)


def duckdb_type(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "VARCHAR"
    if pa.types.is_int64(t):
        return "BIGINT"
    if pa.types.is_int32(t):
        return "INTEGER"
    if pa.types.is_float64(t):
        return "DOUBLE"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "BLOB"
    if pa.types.is_list(t):
        return duckdb_type(t.value_type) + "[]"
    raise TypeError(f"no DuckDB type for {t}")
