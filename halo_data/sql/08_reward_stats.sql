-- reward_stats: one row per run (scope 'run') and one per policy_version (scope 'policy_version'): episodes, groups of attempts (task, task_seed, policy_version), shaped-return mean and std, and frac_reward_zero_std — the share of groups whose rewards are all equal, which give GRPO no signal.
WITH groups_by_run AS (
    SELECT
        run_id,
        any_value(policy_version) AS policy_version,
        count(*) AS n_episodes,
        (max(shaped_return) - min(shaped_return)) <= 1e-9 AS zero_std,
        count(*) FILTER (WHERE success) AS successes
    FROM episodes
    WHERE error IS NULL
    GROUP BY run_id, task_id, task_seed, policy_version
),

groups_by_version AS (
    SELECT
        policy_version,
        count(*) AS n_episodes,
        (max(shaped_return) - min(shaped_return)) <= 1e-9 AS zero_std,
        count(*) FILTER (WHERE success) AS successes
    FROM episodes
    WHERE error IS NULL
    GROUP BY task_id, task_seed, policy_version
),

episode_stats_by_run AS (
    SELECT run_id, sorted_avg(shaped_return) AS reward_mean, coalesce(sorted_stddev_samp(shaped_return), 0) AS reward_std
    FROM episodes WHERE error IS NULL GROUP BY run_id
),

episode_stats_by_version AS (
    SELECT policy_version, sorted_avg(shaped_return) AS reward_mean, coalesce(sorted_stddev_samp(shaped_return), 0) AS reward_std
    FROM episodes WHERE error IS NULL GROUP BY policy_version
)

SELECT
    'run' AS scope,
    g.run_id,
    any_value(g.policy_version) AS policy_version,
    sum(g.n_episodes)::BIGINT AS n_episodes,
    count(*) AS n_groups,
    count(*) FILTER (WHERE NOT g.zero_std) AS n_trainable_groups,
    any_value(e.reward_mean) AS reward_mean,
    any_value(e.reward_std) AS reward_std,
    avg(CASE WHEN g.zero_std THEN 1.0 ELSE 0.0 END) AS frac_reward_zero_std,
    sum(g.successes) / sum(g.n_episodes) AS success_rate
FROM groups_by_run AS g
JOIN episode_stats_by_run AS e USING (run_id)
GROUP BY g.run_id
UNION ALL
SELECT
    'policy_version' AS scope,
    NULL AS run_id,
    g.policy_version,
    sum(g.n_episodes)::BIGINT AS n_episodes,
    count(*) AS n_groups,
    count(*) FILTER (WHERE NOT g.zero_std) AS n_trainable_groups,
    any_value(e.reward_mean) AS reward_mean,
    any_value(e.reward_std) AS reward_std,
    avg(CASE WHEN g.zero_std THEN 1.0 ELSE 0.0 END) AS frac_reward_zero_std,
    sum(g.successes) / sum(g.n_episodes) AS success_rate
FROM groups_by_version AS g
JOIN episode_stats_by_version AS e ON g.policy_version IS NOT DISTINCT FROM e.policy_version
GROUP BY g.policy_version
