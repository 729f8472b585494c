-- eval_matrix: one row per mode x site x split: episodes, tasks, success rate, mean task reward, mean shaped return, median steps and error rate (MiniWoB's site is 'miniwob').
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
    avg(CASE WHEN e.error IS NOT NULL THEN 1.0 ELSE 0.0 END) AS error_rate
FROM episodes AS e
GROUP BY e.mode, e.site, coalesce(e.split, 'all')
