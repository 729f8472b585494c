-- grpo_groups: long form, one row per (level, member step). level 'episode': every step of every episode in a group of attempts of one task with the same task_seed and policy_version (and run_id, variable halo_group_scope = 'run'), rewarded with its episode's shaped return. level 'step': steps taken from the same state_hash (an anchor state) inside one episode group, rewarded with their discounted return (variable halo_gamma). advantage = reward - group_mean (Dr. GRPO, unscaled; exactly 0 in a zero-std group); combined_advantage = A_episode + omega * A_step on both levels (variable halo_omega; A_step is 0 for an anchor seen once).

-- Groups are computed on compact keys (an integer per episode group, the state_hash within it) over one row per
-- member step; the text columns and the group_key strings join once, at the end, where each step becomes its two rows.
WITH episode_rewards AS (
    SELECT
        episode_id, task_id, task_seed, coalesce(policy_version, '') AS version, shaped_return AS reward,
        -- variable halo_group_scope = 'run': a group holds one run's attempts only (policy_version names such as an
        -- online run's '0', '1', ... repeat across runs)
        CASE WHEN getvariable('halo_group_scope') = 'run' THEN run_id ELSE '' END AS scope
    FROM episodes
    WHERE error IS NULL
),

episode_groups AS (
    SELECT
        task_id,
        task_seed,
        version,
        scope,
        -- ordered by the group's own key, so the same group gets the same id wherever this is evaluated
        row_number() OVER (ORDER BY task_id, task_seed, version, scope) AS group_id,
        sorted_avg(reward) AS group_mean,
        coalesce(sorted_stddev_samp(reward), 0) AS group_std,
        count(*) AS group_size,
        (max(reward) - min(reward)) <= 1e-9 AS zero_std
    FROM episode_rewards
    GROUP BY task_id, task_seed, version, scope
),

episode_members AS (
    SELECT
        e.episode_id,
        e.reward,
        g.group_id,
        g.group_mean,
        g.group_std,
        g.group_size,
        g.zero_std,
        CASE WHEN g.zero_std THEN 0.0 ELSE e.reward - g.group_mean END AS advantage
    FROM episode_rewards AS e
    JOIN episode_groups AS g
        ON e.task_id = g.task_id AND e.task_seed IS NOT DISTINCT FROM g.task_seed AND e.version = g.version
        AND e.scope = g.scope
),

-- what the return's window sorts: keys and numbers only
step_keys AS (
    SELECT
        episode_id,
        step_idx,
        state_hash,
        shaped_reward,
        -- prompt_hash, not the prompt: the writer sets one with the other, and the hash is cheap to read
        prompt_hash IS NOT NULL AND model_output IS NOT NULL AND action_source IS DISTINCT FROM 'manager' AS trainable
    FROM step_rewards
),

step_returns AS (
    SELECT
        episode_id,
        step_idx,
        state_hash,
        trainable,
        CASE
            WHEN getvariable('halo_gamma') = 0 THEN shaped_reward
            ELSE sum(shaped_reward * pow(getvariable('halo_gamma'), step_idx)) OVER (
                PARTITION BY episode_id ORDER BY step_idx DESC ROWS UNBOUNDED PRECEDING
            ) / pow(getvariable('halo_gamma'), step_idx)
        END AS discounted_return
    FROM step_keys
),

members AS (
    SELECT
        r.episode_id,
        r.step_idx,
        r.state_hash,
        r.discounted_return,
        e.group_id,
        e.reward AS episode_reward,
        e.group_mean AS episode_group_mean,
        e.group_std AS episode_group_std,
        e.group_size AS episode_group_size,
        e.zero_std AS episode_zero_std,
        e.advantage AS episode_advantage
    FROM step_returns AS r
    JOIN episode_members AS e USING (episode_id)
    WHERE r.trainable
),

-- Anchor states: aggregated and joined back, much cheaper than windows over every step. A step with no
-- state_hash is an anchor of its own (unknown states must not be grouped together): it joins no row here.
anchor_stats AS (
    SELECT
        group_id,
        state_hash,
        sorted_avg(discounted_return) AS group_mean,
        coalesce(sorted_stddev_samp(discounted_return), 0) AS group_std,
        count(*) AS group_size,
        (max(discounted_return) - min(discounted_return)) <= 1e-9 AS zero_std
    FROM members
    WHERE state_hash IS NOT NULL
    GROUP BY group_id, state_hash
),

scored AS (
    SELECT
        m.*,
        coalesce(a.group_mean, m.discounted_return) AS step_group_mean,
        coalesce(a.group_std, 0.0) AS step_group_std,
        coalesce(a.group_size, 1) AS step_group_size,
        coalesce(a.zero_std, true) AS step_zero_std,
        CASE WHEN coalesce(a.zero_std, true) THEN 0.0 ELSE m.discounted_return - a.group_mean END AS step_advantage
    FROM members AS m
    LEFT JOIN anchor_stats AS a ON a.group_id = m.group_id AND a.state_hash = m.state_hash
),

-- the text of each member step, read once (the prompt, the lake's largest column, only when selected)
member_texts AS (
    SELECT
        c.*,
        s.run_id,
        s.task_id,
        s.task_seed,
        s.policy_version,
        s.prompt,
        s.model_output AS completion,
        s.logprob_sum,
        concat_ws('|', s.task_id, coalesce(CAST(s.task_seed AS VARCHAR), ''), coalesce(s.policy_version, ''),
                  CASE WHEN getvariable('halo_group_scope') = 'run' THEN s.run_id END) AS episode_group_key
    FROM scored AS c
    JOIN steps AS s USING (episode_id, step_idx)
)

SELECT
    l.level,
    CASE l.level
        WHEN 'episode' THEN t.episode_group_key
        ELSE t.episode_group_key || '|' || coalesce(t.state_hash, t.episode_id || ':' || CAST(t.step_idx AS VARCHAR))
    END AS group_key,
    CASE l.level WHEN 'episode' THEN t.episode_id ELSE t.episode_id || ':' || CAST(t.step_idx AS VARCHAR) END AS member_id,
    t.run_id,
    t.task_id,
    t.task_seed,
    t.policy_version,
    t.episode_id,
    t.step_idx,
    t.state_hash,
    t.prompt,
    t.completion,
    t.logprob_sum,
    CASE l.level WHEN 'episode' THEN t.episode_reward ELSE t.discounted_return END AS reward,
    CASE l.level WHEN 'episode' THEN t.episode_group_mean ELSE t.step_group_mean END AS group_mean,
    CASE l.level WHEN 'episode' THEN t.episode_group_std ELSE t.step_group_std END AS group_std,
    CASE l.level WHEN 'episode' THEN t.episode_group_size ELSE t.step_group_size END AS group_size,
    CASE l.level WHEN 'episode' THEN t.episode_zero_std ELSE t.step_zero_std END AS zero_std,
    CASE l.level WHEN 'episode' THEN t.episode_advantage ELSE t.step_advantage END AS advantage,
    t.episode_advantage + getvariable('halo_omega') * t.step_advantage AS combined_advantage
FROM member_texts AS t
-- each member step is one row per level: a cross join with the two level names, no second pass
CROSS JOIN (VALUES ('episode'), ('step')) AS l(level)
