-- episodes: one row per episode: its fields (stored on each of its steps), step counts, the sum of each reward component (final_task_progress: the share of the task's expectations met at the end, NULL where not measured), the shaped return under the current weights, and its actions by source (policy, manager, cache, macro, recovery) with tokens and estimated cost.
WITH per_episode AS (
    -- float sums are sorted_sum (macros.sql): the same digits on every run
    SELECT
        episode_id,
        any_value(run_id) AS run_id,
        any_value(env) AS env,
        any_value(task_id) AS task_id,
        any_value(site) AS site,
        any_value(task_version) AS task_version,
        any_value(split) AS split,
        any_value(mode) AS mode,
        any_value(policy) AS policy,
        any_value(model) AS model,
        any_value(adapter) AS adapter,
        any_value(policy_version) AS policy_version,
        any_value(attempt_idx) AS attempt_idx,
        any_value(seed) AS seed,
        any_value(task_seed) AS task_seed,
        any_value(temperature) AS temperature,
        any_value(success) AS success,
        any_value(task_reward) AS task_reward,
        any_value(raw_reward) AS raw_reward,
        any_value(n_steps) AS n_steps,
        any_value(terminated) AS terminated,
        any_value(truncated) AS truncated,
        any_value(error) AS error,
        any_value(error_kind) AS error_kind,
        any_value(started_at) AS started_at,
        any_value(ended_at) AS ended_at,
        count(*) AS n_step_rows,
        count(*) FILTER (WHERE action_valid) AS n_valid_actions,
        count(*) FILTER (WHERE NOT coalesce(action_valid, false) AND model_output IS NOT NULL
                         AND action_source IS DISTINCT FROM 'manager') AS n_invalid_actions,
        count(*) FILTER (WHERE parse_error IS NOT NULL) AS n_parse_errors,
        max(coalesce(cumulative_progress, 0)) AS final_progress,
        sorted_sum(coalesce(r_progress, 0)) AS r_progress,
        sorted_sum(coalesce(r_novelty, 0)) AS r_novelty,
        sorted_sum(coalesce(r_loop, 0)) AS r_loop,
        sorted_sum(coalesce(r_validity, 0)) AS r_validity,
        sorted_sum(coalesce(r_success, 0)) AS r_success,
        -- NULL where the task has no expectations (nothing measured): not the same as 0
        sorted_sum(r_task_progress) AS r_task_progress,
        sorted_sum(r_task_progress) AS final_task_progress,
        sorted_sum(shaped_reward) AS shaped_return,
        sorted_sum(coalesce(latency_ms, 0)) AS policy_ms,
        sorted_sum(coalesce(env_ms, 0)) AS env_ms,
        sum(coalesce(prompt_tokens, 0))::BIGINT AS prompt_tokens,
        sum(coalesce(completion_tokens, 0))::BIGINT AS completion_tokens,
        -- the hierarchical agent's sources of action (halo_agent.hierarchy), and what its model calls cost
        count(*) FILTER (WHERE action_source IS DISTINCT FROM 'manager') AS n_actions,
        count(*) FILTER (WHERE action_source IN ('worker', 'model', 'random')) AS n_policy_steps,
        count(*) FILTER (WHERE action_source = 'manager') AS n_manager_calls,
        count(*) FILTER (WHERE action_source = 'cache') AS n_cache_hits,
        count(*) FILTER (WHERE action_source = 'macro') AS n_macro_steps,
        count(*) FILTER (WHERE action_source = 'recovery') AS n_recovery_steps,
        count(*) FILTER (WHERE call_model IS NOT NULL) AS n_model_calls,
        sorted_sum(coalesce(cost_usd, 0)) AS cost_usd
    FROM step_rewards
    GROUP BY episode_id
)

SELECT * FROM per_episode
