-- dpo_pairs: one row per preference pair: prompt, chosen, rejected. From episodes: steps with the same prompt in different episodes of a task, chosen from the higher-ranked episode, outputs differing (by default one pair per prompt: the best-ranked step against the worst-ranked one whose output differs; variable halo_dpo_pairing = 'all' keeps every ordered pair). Pairs are made across the whole lake, run_id naming the chosen step's run; variable halo_dpo_scope = 'run' pairs steps within each run only. From candidates: the best- and worst-scored differing samples at one state. From search trees (source 'mcts'): mcts_pairs, by default the highest- against the lowest-Q sibling of each node ('all': every pair), with the stored generation logprobs and the nodes they came from (chosen_node_id, rejected_node_id; NULL for the other sources).
WITH ranked_steps AS (
    SELECT
        s.run_id,
        s.task_id,
        s.prompt_hash,
        s.model_output AS completion,
        s.episode_id,
        s.step_idx,
        r.rank,
        r.percentile
    FROM steps AS s
    JOIN progress_ranking AS r USING (episode_id)
    -- pairing reads the prompt's hash only; the prompt text joins the few pairs at the end
    WHERE s.prompt_hash IS NOT NULL AND s.model_output IS NOT NULL AND r.error IS NULL
      AND s.action_source IS DISTINCT FROM 'manager'  -- a manager's advice is no action to prefer
),

-- variable halo_dpo_scope = 'run': a step is paired only with steps of its own run (NULL: across the lake)
keyed_steps AS (
    SELECT *, CASE WHEN getvariable('halo_dpo_scope') = 'run' THEN run_id END AS pair_scope
    FROM ranked_steps
),

-- The prompts with two different outputs, the only ones a pair can come from. Most of a lake's prompts are seen
-- once (every state after the first few of an episode is new): the pairing below sorts and joins only the rest.
-- Grouped on one 64-bit hash of the prompt's key, much cheaper than its strings: a collision only lets a prompt
-- through that cannot pair, which the pairing below drops on the real key.
contested AS (
    SELECT hash(task_id, prompt_hash, pair_scope) AS prompt_key
    FROM keyed_steps
    GROUP BY prompt_key
    HAVING min(completion) <> max(completion)
),

contested_steps AS (
    SELECT *
    FROM keyed_steps
    WHERE hash(task_id, prompt_hash, pair_scope) IN (SELECT prompt_key FROM contested)
),

-- variable halo_dpo_pairing = 'all': every ordered pair of differing outputs at a prompt (quadratic in its steps)
all_pairs AS (
    SELECT c, r
    FROM contested_steps AS c
    JOIN contested_steps AS r
        ON c.task_id = r.task_id
        AND c.prompt_hash = r.prompt_hash
        AND c.pair_scope IS NOT DISTINCT FROM r.pair_scope
        AND c.rank < r.rank
        AND c.completion <> r.completion
    WHERE getvariable('halo_dpo_pairing') = 'all'
    -- every (prompt, chosen episode, rejected episode) once, from their earliest steps
    QUALIFY row_number() OVER (
        PARTITION BY c.task_id, c.prompt_hash, c.episode_id, r.episode_id ORDER BY c.step_idx, r.step_idx
    ) = 1
),

-- By default one pair per prompt: the best-ranked step against the worst-ranked step whose output differs
-- (ties: the better other side, then the lower episode ids and step indexes). Found in time linear in the
-- prompt's steps: a step's worst differing rival is the worst rank among the other outputs, which the two
-- outputs with the worst ranks give.
output_worst AS (
    SELECT task_id, prompt_hash, pair_scope, completion, max(rank) AS worst
    FROM contested_steps
    WHERE getvariable('halo_dpo_pairing') IS DISTINCT FROM 'all'
    GROUP BY ALL
),

worst_two AS (
    SELECT
        task_id, prompt_hash, pair_scope,
        any_value(completion) FILTER (WHERE n = 1) AS worst_output,
        max(worst) FILTER (WHERE n = 1) AS worst_rank,
        max(worst) FILTER (WHERE n = 2) AS runner_up_rank
    FROM (
        SELECT *, row_number() OVER (PARTITION BY task_id, prompt_hash, pair_scope ORDER BY worst DESC, completion) AS n
        FROM output_worst
    )
    WHERE n <= 2
    GROUP BY ALL
),

best_chosen AS (
    SELECT s AS c, CASE WHEN s.completion = w.worst_output THEN w.runner_up_rank ELSE w.worst_rank END AS rival_rank
    FROM contested_steps AS s
    JOIN worst_two AS w
        ON s.task_id = w.task_id AND s.prompt_hash = w.prompt_hash AND s.pair_scope IS NOT DISTINCT FROM w.pair_scope
    WHERE rival_rank > s.rank
    -- the best-ranked steps with a worse differing rival (all the steps of that episode at the prompt)
    QUALIFY rank() OVER (PARTITION BY s.task_id, s.prompt_hash, s.pair_scope ORDER BY s.rank, rival_rank DESC, s.episode_id) = 1
),

best_pairs AS (
    SELECT b.c, r
    FROM best_chosen AS b
    JOIN contested_steps AS r
        ON b.c.task_id = r.task_id
        AND b.c.prompt_hash = r.prompt_hash
        AND b.c.pair_scope IS NOT DISTINCT FROM r.pair_scope
        AND r.rank = b.rival_rank
        AND b.c.completion <> r.completion
    QUALIFY row_number() OVER (
        PARTITION BY b.c.task_id, b.c.prompt_hash, b.c.pair_scope
        ORDER BY r.episode_id, b.c.step_idx, r.step_idx
    ) = 1
),

-- chosen step c, rejected step r (rows of keyed_steps)
episode_pairs_by_key AS (
    SELECT
        'episodes' AS source,
        c.run_id,
        c.task_id,
        c.prompt_hash,
        c.completion AS chosen,
        r.completion AS rejected,
        c.episode_id AS chosen_episode_id,
        c.step_idx AS chosen_step_idx,
        r.episode_id AS rejected_episode_id,
        r.step_idx AS rejected_step_idx,
        c.percentile AS chosen_score,
        r.percentile AS rejected_score
    FROM (SELECT c, r FROM all_pairs UNION ALL SELECT c, r FROM best_pairs)
),

episode_pairs AS (
    SELECT
        p.source, p.run_id, p.task_id, p.prompt_hash, s.prompt, p.chosen, p.rejected,
        p.chosen_episode_id, p.chosen_step_idx, p.rejected_episode_id, p.rejected_step_idx,
        p.chosen_score, p.rejected_score
    FROM episode_pairs_by_key AS p
    LEFT JOIN steps AS s ON s.episode_id = p.chosen_episode_id AND s.step_idx = p.chosen_step_idx
),

candidate_pairs AS (
    SELECT
        'candidates' AS source,
        c.run_id,
        c.task_id,
        c.prompt_hash,
        c.prompt,
        c.model_output AS chosen,
        r.model_output AS rejected,
        c.episode_id AS chosen_episode_id,
        c.step_idx AS chosen_step_idx,
        r.episode_id AS rejected_episode_id,
        r.step_idx AS rejected_step_idx,
        c.score AS chosen_score,
        r.score AS rejected_score
    FROM candidates AS c
    JOIN candidates AS r
        ON c.run_id = r.run_id
        AND c.episode_id = r.episode_id
        AND c.step_idx = r.step_idx
        AND c.score > r.score
        AND c.model_output <> r.model_output
    WHERE c.prompt IS NOT NULL
    QUALIFY
        getvariable('halo_dpo_pairing') = 'all'
        OR row_number() OVER (
            PARTITION BY c.run_id, c.episode_id, c.step_idx
            ORDER BY c.score DESC, r.score ASC, c.candidate_idx, r.candidate_idx
        ) = 1
),

mcts_step_pairs AS (
    SELECT
        source, run_id, task_id, prompt_hash, prompt, chosen, rejected,
        tree_id AS chosen_episode_id,
        step_idx AS chosen_step_idx,
        tree_id AS rejected_episode_id,
        step_idx AS rejected_step_idx,
        chosen_q AS chosen_score,
        rejected_q AS rejected_score,
        chosen_logprob_sum,
        rejected_logprob_sum,
        chosen_node_id,
        rejected_node_id
    FROM mcts_pairs
    QUALIFY
        getvariable('halo_dpo_pairing') = 'all'
        OR row_number() OVER (
            PARTITION BY run_id, tree_id, parent_id
            ORDER BY chosen_q DESC, rejected_q ASC, chosen_node_id, rejected_node_id
        ) = 1
)

SELECT *, chosen_score - rejected_score AS score_margin FROM episode_pairs
UNION ALL BY NAME
SELECT *, chosen_score - rejected_score AS score_margin FROM candidate_pairs
UNION ALL BY NAME
SELECT *, chosen_score - rejected_score AS score_margin FROM mcts_step_pairs
