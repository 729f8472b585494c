-- state_groups: one row per scored candidate in a per-state group: the actions sampled in one policy call at one visited state (run_id, episode_id, step_idx, state_hash, policy_version), each executed from that state restored by replay and scored with the dense reward (candidates.score). advantage = score - group_mean (Dr. GRPO, unscaled; exactly 0 in a zero-std group); group_min is the group's lowest score (the baseline of groups that enumerate a page's actions instead of sampling them). A state that did not reproduce (any candidate with score_source 'unreproducible' or no score) is left out whole.

-- Groups are computed on keys and scores only; the candidates' text joins once, at the end.
WITH keyed AS (
    SELECT
        run_id,
        episode_id,
        step_idx,
        state_hash,
        coalesce(policy_version, '') AS version,
        candidate_idx,
        score,
        score IS NOT NULL AND score_source IS DISTINCT FROM 'unreproducible' AS scored
    FROM candidates
),

state_stats AS (
    SELECT
        run_id,
        episode_id,
        step_idx,
        state_hash,
        version,
        sorted_avg(score) AS group_mean,
        coalesce(sorted_stddev_samp(score), 0) AS group_std,
        min(score) AS group_min,
        count(*) AS group_size,
        (max(score) - min(score)) <= 1e-9 AS zero_std
    FROM keyed
    GROUP BY run_id, episode_id, step_idx, state_hash, version
    -- one candidate that did not reproduce flags its whole state: never trained on
    HAVING bool_and(scored)
)

SELECT
    concat_ws('|', c.run_id, c.episode_id, CAST(c.step_idx AS VARCHAR), coalesce(c.state_hash, ''), g.version) AS group_key,
    c.run_id,
    c.env,
    c.task_id,
    c.episode_id,
    c.step_idx,
    c.state_hash,
    c.policy_version,
    c.candidate_idx,
    c.prompt,
    c.prompt_hash,
    c.model_output AS completion,
    c.action,
    c.logprob_sum,
    c.score,
    c.score_source,
    g.group_mean,
    g.group_std,
    g.group_min,
    g.group_size,
    g.zero_std,
    CASE WHEN g.zero_std THEN 0.0 ELSE c.score - g.group_mean END AS advantage
FROM candidates AS c
JOIN state_stats AS g
    ON c.run_id = g.run_id
    AND c.episode_id = g.episode_id
    AND c.step_idx = g.step_idx
    AND c.state_hash IS NOT DISTINCT FROM g.state_hash
    AND coalesce(c.policy_version, '') = g.version
