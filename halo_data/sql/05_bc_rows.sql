-- bc_rows: one row per step of the chosen episodes (in_top_percent of progress_ranking, no episode error) with a valid action: prompt (chat messages JSON) -> completion (the output to imitate).
SELECT
    s.prompt,
    s.model_output AS completion,
    s.prompt_version,
    s.prompt_hash,
    s.run_id,
    s.env,
    s.task_id,
    s.episode_id,
    s.step_idx,
    s.policy_version,
    r.success,
    r.final_progress,
    r.rank,
    r.percentile
FROM steps AS s
JOIN progress_ranking AS r USING (episode_id)
WHERE r.in_top_percent
  AND r.error IS NULL
  AND s.action_valid
  AND s.prompt_hash IS NOT NULL  -- set with the prompt; cheaper to test than the prompt itself
  AND s.model_output IS NOT NULL
