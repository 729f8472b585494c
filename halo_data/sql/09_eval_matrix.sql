-- eval_matrix: one row per mode x site x split: episodes, tasks, success rate, mean task reward, mean shaped return, median steps and error rate (MiniWoB's site is 'miniwob'); per episode, model calls, tokens in and out and estimated cost; manager calls and cache hits per action.
SELECT
    e.mode,
    e.site,
    coalesce(e.split, 'all') AS split,
    count(*) AS n_episodes,
    count(DISTINCT e.task_id) AS n_tasks,
    avg(CASE WHEN e.success THEN 1.0 ELSE 0.0 END) AS success_rate,
    sorted_avg(e.task_reward) AS mean_task_reward,
    sorted_avg(e.shaped_return) AS mean_shaped_return,
    median(coalesce(e.n_steps, e.n_step_rows)) AS median_steps,
    avg(CASE WHEN e.error IS NOT NULL THEN 1.0 ELSE 0.0 END) AS error_rate,
    avg(e.n_model_calls) AS mean_model_calls,
    avg(e.prompt_tokens) AS mean_prompt_tokens,
    avg(e.completion_tokens) AS mean_completion_tokens,
    sorted_avg(e.cost_usd) AS mean_cost_usd,
    sum(e.n_manager_calls)::DOUBLE / greatest(sum(e.n_actions), 1) AS manager_call_rate,
    sum(e.n_cache_hits)::DOUBLE / greatest(sum(e.n_actions), 1) AS cache_hit_rate
FROM episodes AS e
GROUP BY e.mode, e.site, coalesce(e.split, 'all')
