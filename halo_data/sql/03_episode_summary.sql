-- episode_summary: one row per run and task: attempts, successes, success rate, mean shaped return, mean steps and errors.
SELECT
    run_id,
    any_value(env) AS env,
    task_id,
    any_value(site) AS site,
    any_value(mode) AS mode,
    any_value(policy_version) AS policy_version,
    count(*) AS attempts,
    count(*) FILTER (WHERE success) AS successes,
    avg(CASE WHEN success THEN 1.0 ELSE 0.0 END) AS success_rate,
    sorted_avg(shaped_return) AS mean_shaped_return,
    coalesce(sorted_stddev_samp(shaped_return), 0) AS std_shaped_return,
    sorted_avg(task_reward) AS mean_task_reward,
    sorted_avg(final_progress) AS mean_final_progress,
    avg(n_steps) AS mean_steps,
    count(*) FILTER (WHERE error IS NOT NULL) AS errors
FROM episodes
GROUP BY run_id, task_id
