-- step_rewards: one row per step, with its stored reward components re-weighted by the current weights (variables halo_w_*) into shaped_reward.
SELECT
    s.*,
    coalesce(s.r_progress, 0) * getvariable('halo_w_progress')
    + coalesce(s.r_novelty, 0) * getvariable('halo_w_novelty')
    + coalesce(s.r_loop, 0) * getvariable('halo_w_loop')
    + coalesce(s.r_validity, 0) * getvariable('halo_w_validity')
    + coalesce(s.r_success, 0) * getvariable('halo_w_success')
    + coalesce(s.r_task_progress, 0) * getvariable('halo_w_task_progress') AS shaped_reward
FROM steps AS s
