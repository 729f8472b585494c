-- mcts_pairs: one row per step-level preference pair from a search tree (Agent Q): two sibling actions, both tried (visits > 0) and reproducible under a reproducible parent, whose blended Q differ by more than the run's θ (config search.theta, 0.1 where unset); chosen = the higher Q. The prompt is the parent's, the one the siblings were sampled from; logprob_sum columns are the stored generation logprobs (a DPO reference where present).
WITH run_theta AS (
    SELECT
        run_id,
        coalesce(try_cast(json_extract(config, '$.search.theta') AS DOUBLE), 0.1) AS theta
    FROM runs
),

tried AS (
    SELECT
        n.run_id,
        n.tree_id,
        n.task_id,
        n.parent_id,
        n.node_id,
        n.depth,
        coalesce(n.model_output, n.action) AS completion,
        n.q,
        n.visits,
        n.logprob_sum
    FROM mcts_nodes AS n
    WHERE n.parent_id IS NOT NULL
        AND n.reproducible IS NOT false
        AND n.visits > 0
        AND coalesce(n.model_output, n.action) IS NOT NULL
),

parents AS (
    SELECT run_id, tree_id, node_id AS parent_id, prompt, prompt_hash
    FROM mcts_nodes
    WHERE reproducible IS NOT false AND prompt IS NOT NULL
)

SELECT
    'mcts' AS source,
    c.run_id,
    c.task_id,
    c.tree_id,
    c.parent_id,
    c.depth - 1 AS step_idx,
    p.prompt_hash,
    p.prompt,
    c.completion AS chosen,
    r.completion AS rejected,
    c.node_id AS chosen_node_id,
    r.node_id AS rejected_node_id,
    c.q AS chosen_q,
    r.q AS rejected_q,
    c.q - r.q AS q_margin,
    c.visits AS chosen_visits,
    r.visits AS rejected_visits,
    c.logprob_sum AS chosen_logprob_sum,
    r.logprob_sum AS rejected_logprob_sum,
    coalesce(t.theta, 0.1) AS theta
FROM tried AS c
JOIN tried AS r
    ON c.run_id = r.run_id
    AND c.tree_id = r.tree_id
    AND c.parent_id = r.parent_id
    AND c.node_id <> r.node_id
    AND c.completion <> r.completion
JOIN parents AS p
    ON p.run_id = c.run_id AND p.tree_id = c.tree_id AND p.parent_id = c.parent_id
LEFT JOIN run_theta AS t ON t.run_id = c.run_id
WHERE c.q - r.q > coalesce(t.theta, 0.1)
