-- progress_ranking: one row per episode, ranked within its task by success, then task-aware progress (final_task_progress: the share of the task's expectations met; where measured), then final (milestone) progress, then fewer steps (ties share a rank); percentile 1.0 is the best; in_top_percent applies the top-percent cut (variable halo_top_percent).
WITH ranked AS (
    SELECT
        episode_id,
        run_id,
        env,
        task_id,
        site,
        task_seed,
        attempt_idx,
        policy_version,
        mode,
        success,
        final_task_progress,
        final_progress,
        coalesce(n_steps, n_step_rows) AS n_steps,
        shaped_return,
        error,
        rank() OVER by_task AS rank,
        count(*) OVER (PARTITION BY task_id) AS task_episodes
    FROM episodes
    WINDOW by_task AS (
        PARTITION BY task_id
        ORDER BY coalesce(success, false) DESC, final_task_progress DESC NULLS LAST, final_progress DESC, coalesce(n_steps, n_step_rows) ASC
    )
)

SELECT
    *,
    CASE WHEN task_episodes = 1 THEN 1.0 ELSE 1.0 - (rank - 1) / (task_episodes - 1) END AS percentile,
    rank <= greatest(1, ceil(task_episodes * getvariable('halo_top_percent') / 100.0)) AS in_top_percent
FROM ranked
