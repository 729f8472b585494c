-- reward_stats: one row per run (scope 'run') and one per policy_version (scope 'policy_version'): episodes, groups of attempts (task, task_seed, policy_version), shaped-return mean and std, and frac_reward_zero_std — the share of groups whose rewards are all equal, which give GRPO no signal.
WITH scoped AS (
    -- Every episode twice: once in its run, once in its policy_version; scope_key is the run_id or the policy_version.
    SELECT 'run' AS scope, run_id AS scope_key, run_id, policy_version, task_id, task_seed, shaped_return, success
    FROM episodes
    WHERE error IS NULL
    UNION ALL
    SELECT 'policy_version', policy_version, NULL, policy_version, task_id, task_seed, shaped_return, success
    FROM episodes
    WHERE error IS NULL
),

groups AS (
    SELECT
        scope,
        scope_key,
        count(*) AS n_episodes,
        (max(shaped_return) - min(shaped_return)) <= 1e-9 AS zero_std,
        count(*) FILTER (WHERE success) AS successes
    FROM scoped
    GROUP BY scope, scope_key, task_id, task_seed, policy_version
),

episode_stats AS (
    SELECT
        scope,
        scope_key,
        any_value(run_id) AS run_id,
        any_value(policy_version) AS policy_version,
        sorted_avg(shaped_return) AS reward_mean,
        coalesce(sorted_stddev_samp(shaped_return), 0) AS reward_std
    FROM scoped
    GROUP BY scope, scope_key
)

SELECT
    e.scope,
    e.run_id,
    e.policy_version,
    sum(g.n_episodes)::BIGINT AS n_episodes,
    count(*) AS n_groups,
    count(*) FILTER (WHERE NOT g.zero_std) AS n_trainable_groups,
    any_value(e.reward_mean) AS reward_mean,
    any_value(e.reward_std) AS reward_std,
    avg(CASE WHEN g.zero_std THEN 1.0 ELSE 0.0 END) AS frac_reward_zero_std,
    sum(g.successes) / sum(g.n_episodes) AS success_rate
FROM groups AS g
JOIN episode_stats AS e ON g.scope = e.scope AND g.scope_key IS NOT DISTINCT FROM e.scope_key
GROUP BY e.scope, e.scope_key, e.run_id, e.policy_version
