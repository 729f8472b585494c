-- learning-v2's greedy evaluations on the checkbox tasks: how many episodes open by clicking Submit (before any box),
-- and how many of those MiniWoB scored a success (raw reward above 0: a majority of boxes right). On the unpacked root:
--   halo-data query - --lake runs/learning-v2/lake < bench/protocols/learning-v2-submit-first.sql
select run_id, task_id, count(*) as episodes,
       count(*) filter (where regexp_matches(observation, '\[' || regexp_extract(action, 'click\(''(\d+)''\)', 1) || '\] button ''Submit''')) as submit_first,
       count(*) filter (where success and regexp_matches(observation, '\[' || regexp_extract(action, 'click\(''(\d+)''\)', 1) || '\] button ''Submit''')) as submit_first_successes
from steps where step_idx = 0 and run_id like 'lv2-eval-%-t0' and task_id like 'miniwob.click-checkboxes%'
group by all order by task_id, run_id
