-- grpo_groups: long form, one row per (level, member step). level 'episode': every step of every episode in a group of attempts of one task with the same task_seed and policy_version, rewarded with its episode's shaped return. level 'step': steps taken from the same state_hash (an anchor state) inside one episode group, rewarded with their discounted return (variable halo_gamma). advantage = reward - group_mean (Dr. GRPO, unscaled); combined_advantage = A_episode + omega * A_step on both levels (variable halo_omega; A_step is 0 for an anchor seen once).
WITH episode_members AS (
    SELECT
        episode_id,
        task_id,
        task_seed,
        policy_version,
        shaped_return AS reward,
        concat_ws('|', task_id, coalesce(CAST(task_seed AS VARCHAR), ''), coalesce(policy_version, '')) AS group_key
    FROM episodes
    WHERE error IS NULL
),

episode_group_stats AS (
    SELECT
        group_key,
        avg(reward) AS group_mean,
        coalesce(stddev_samp(reward), 0) AS group_std,
        count(*) AS group_size,
        (max(reward) - min(reward)) <= 1e-9 AS zero_std
    FROM episode_members
    GROUP BY group_key
),

episode_groups AS (
    SELECT m.*, g.group_mean, g.group_std, g.group_size, g.zero_std
    FROM episode_members AS m
    JOIN episode_group_stats AS g USING (group_key)
),

step_returns AS (
    SELECT
        s.episode_id,
        s.run_id,
        s.step_idx,
        s.state_hash,
        -- prompt_hash, not the prompt: the writer sets one with the other, and the hash is cheap to read
        s.prompt_hash IS NOT NULL AND s.model_output IS NOT NULL AS trainable,
        s.model_output AS completion,
        s.logprob_sum,
        s.shaped_reward,
        CASE
            WHEN getvariable('halo_gamma') = 0 THEN s.shaped_reward
            ELSE sum(s.shaped_reward * pow(getvariable('halo_gamma'), s.step_idx)) OVER (
                PARTITION BY s.episode_id ORDER BY s.step_idx DESC ROWS UNBOUNDED PRECEDING
            ) / pow(getvariable('halo_gamma'), s.step_idx)
        END AS discounted_return
    FROM step_rewards AS s
    WHERE s.episode_id IN (SELECT episode_id FROM episode_members)
),

members AS (
    SELECT
        st.*,
        e.task_id,
        e.task_seed,
        e.policy_version,
        e.group_key AS episode_group_key,
        e.reward AS episode_reward,
        e.group_mean AS episode_group_mean,
        e.group_std AS episode_group_std,
        e.group_size AS episode_group_size,
        e.zero_std AS episode_zero_std,
        e.reward - e.group_mean AS episode_advantage
    FROM step_returns AS st
    JOIN episode_groups AS e USING (episode_id)
    WHERE st.trainable
),

-- Group statistics by aggregation and a join: much cheaper than windows over every step.
anchor_keyed AS (
    SELECT
        *,
        -- a step with no state_hash is an anchor of its own: unknown states must not be grouped together
        episode_group_key || '|' || coalesce(state_hash, episode_id || ':' || CAST(step_idx AS VARCHAR)) AS step_group_key
    FROM members
),

anchor_stats AS (
    SELECT
        step_group_key,
        avg(discounted_return) AS step_group_mean,
        coalesce(stddev_samp(discounted_return), 0) AS step_group_std,
        count(*) AS step_group_size,
        (max(discounted_return) - min(discounted_return)) <= 1e-9 AS step_zero_std
    FROM anchor_keyed
    GROUP BY step_group_key
),

anchors AS (
    SELECT k.*, a.step_group_mean, a.step_group_std, a.step_group_size, a.step_zero_std
    FROM anchor_keyed AS k
    JOIN anchor_stats AS a USING (step_group_key)
),

combined AS (
    SELECT
        *,
        discounted_return - step_group_mean AS step_advantage,
        episode_advantage + getvariable('halo_omega') * (discounted_return - step_group_mean) AS combined_advantage
    FROM anchors
),

-- Statistics run without the prompt text (the largest column of the lake); it joins once, at the end.
long_form AS (
    SELECT
        'episode' AS level,
        episode_group_key AS group_key,
        episode_id AS member_id,
        run_id, task_id, task_seed, policy_version, episode_id, step_idx, state_hash, completion, logprob_sum,
        episode_reward AS reward,
        episode_group_mean AS group_mean,
        episode_group_std AS group_std,
        episode_group_size AS group_size,
        episode_zero_std AS zero_std,
        episode_advantage AS advantage,
        combined_advantage
    FROM combined
    UNION ALL
    SELECT
        'step' AS level,
        step_group_key AS group_key,
        episode_id || ':' || CAST(step_idx AS VARCHAR) AS member_id,
        run_id, task_id, task_seed, policy_version, episode_id, step_idx, state_hash, completion, logprob_sum,
        discounted_return AS reward,
        step_group_mean AS group_mean,
        step_group_std AS group_std,
        step_group_size AS group_size,
        step_zero_std AS zero_std,
        step_advantage AS advantage,
        combined_advantage
    FROM combined
)

SELECT
    l.level, l.group_key, l.member_id,
    l.run_id, l.task_id, l.task_seed, l.policy_version, l.episode_id, l.step_idx, l.state_hash,
    t.prompt, l.completion, l.logprob_sum,
    l.reward, l.group_mean, l.group_std, l.group_size, l.zero_std, l.advantage, l.combined_advantage
FROM long_form AS l
LEFT JOIN steps AS t ON t.episode_id = l.episode_id AND t.step_idx = l.step_idx
