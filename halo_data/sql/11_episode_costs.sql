-- episode_costs: one row per episode x model called in it (the worker's, the manager's): its role, calls, tokens in and out as the endpoint reported them, and estimated cost (from the price table at collection time).
SELECT
    s.episode_id,
    any_value(s.run_id) AS run_id,
    any_value(s.mode) AS mode,
    any_value(s.site) AS site,
    any_value(s.task_id) AS task_id,
    s.call_model AS model,
    CASE WHEN bool_or(s.action_source = 'manager') THEN 'manager' ELSE 'worker' END AS role,
    count(*) AS calls,
    sum(coalesce(s.prompt_tokens, 0))::BIGINT AS prompt_tokens,
    sum(coalesce(s.completion_tokens, 0))::BIGINT AS completion_tokens,
    sorted_sum(coalesce(s.cost_usd, 0)) AS cost_usd
FROM steps AS s
WHERE s.call_model IS NOT NULL
GROUP BY s.episode_id, s.call_model, s.action_source = 'manager'
