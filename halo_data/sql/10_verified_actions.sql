-- verified_actions: one row per scope (task or site) x key x state_hash x action: an action that led to progress from that state in successful episodes (the verified action cache), with its support (successful episodes), tries (episodes taking it there) and success rate; action_rank 1 is the one to replay.

-- An action "led to progress" when it executed and then reached a milestone, succeeded, or changed the
-- state (the episode's next action row starts from another state_hash). Its element is kept as the
-- text of its AXTree line (`target`), since element ids change between page loads of one state.
-- Replays of the cache (action_source 'cache') are no new evidence; one that failed (did not execute, or
-- left the state as it was without progress) invalidates its entry for every later snapshot.
WITH actions AS (
    SELECT
        s.episode_id,
        s.task_id,
        s.site,
        s.state_hash,
        s.action,
        s.action_valid,
        e.success,
        coalesce(s.action_source = 'cache', false) AS replayed,
        coalesce(s.r_progress, 0) > 0 OR coalesce(s.r_success, 0) > 0
            OR lead(s.state_hash) OVER (PARTITION BY s.episode_id ORDER BY s.step_idx) IS DISTINCT FROM s.state_hash
            AS moved,
        regexp_extract(s.action, '^\w+\(\s*[''"]([^''"]*)[''"]', 1) AS target_bid,
        s.observation
    FROM steps AS s
    JOIN episodes AS e USING (episode_id)
    WHERE s.action IS NOT NULL
      AND s.state_hash IS NOT NULL
      AND e.error IS NULL
      AND s.action_source IS DISTINCT FROM 'manager'
),

described AS (
    SELECT
        *,
        CASE WHEN target_bid <> '' THEN trim(regexp_extract(observation, '\[' || target_bid || '\]([^\n]*)', 1)) END AS target,
        CASE WHEN target_bid <> '' THEN regexp_replace(action, '^(\w+\(\s*)[''"][^''"]*[''"]', '\1<bid>') ELSE action END
            AS action_template
    FROM actions
),

scoped AS (
    SELECT 'task' AS scope, task_id AS key, * EXCLUDE (observation) FROM described
    UNION ALL
    SELECT 'site' AS scope, site AS key, * EXCLUDE (observation) FROM described WHERE site IS NOT NULL
),

tallied AS (
    SELECT
        scope,
        key,
        state_hash,
        action_template,
        coalesce(target, '') AS target,
        min(action) AS action,  -- one concrete action with its element id of that time
        count(DISTINCT episode_id) FILTER (WHERE NOT replayed AND success AND action_valid AND moved) AS support,
        count(DISTINCT episode_id) FILTER (WHERE NOT replayed) AS tries,
        count(DISTINCT episode_id) FILTER (WHERE NOT replayed AND success) AS successful_tries,
        count(*) FILTER (WHERE replayed AND NOT (coalesce(action_valid, false) AND moved)) AS failed_replays
    FROM scoped
    GROUP BY scope, key, state_hash, action_template, coalesce(target, '')
),

kept AS (
    SELECT * FROM tallied WHERE support > 0 AND failed_replays = 0
)

SELECT
    scope,
    key,
    state_hash,
    action,
    action_template,
    target,
    support,
    tries,
    successful_tries::DOUBLE / tries AS success_rate,
    row_number() OVER (
        PARTITION BY scope, key, state_hash ORDER BY support DESC, successful_tries::DOUBLE / tries DESC, action_template, target
    ) AS action_rank
FROM kept
