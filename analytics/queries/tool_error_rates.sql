-- How often each tool call is rejected in finished episodes, how many rejections chaos caused, and the most common rejection code.
-- param agent VARCHAR = NULL: only steps of this agent
-- param task TASK = NULL: only this task family
-- param min_calls INTEGER[0..] = 1: leave out tools called fewer times
WITH s AS (
    SELECT tool, accepted, reject_cause, reject_code, chaos_active
    FROM steps
    -- running episodes are few: leaving them out is cheaper than joining the finished ones
    ANTI JOIN (SELECT episode_id FROM episodes WHERE outcome IS NULL) running USING (episode_id)
    WHERE ($agent IS NULL OR agent = $agent)
      AND ($task IS NULL OR task = $task)
),
-- one pass over the steps, per (tool, code); tools and their top code come from these few rows
per_code AS (
    SELECT tool, reject_code, count(*) AS n,
           count(*) FILTER (WHERE NOT accepted) AS rejected,
           count(*) FILTER (WHERE reject_cause = 'chaos') AS chaos_rejections,
           count(*) FILTER (WHERE NOT accepted AND len(chaos_active) > 0) AS under_chaos
    FROM s GROUP BY ALL
)
SELECT tool,
       sum(n)::BIGINT AS calls,
       sum(rejected)::BIGINT AS rejected,
       round(sum(rejected) / sum(n), 4) AS error_rate,
       sum(chaos_rejections)::BIGINT AS chaos_rejections,
       sum(under_chaos)::BIGINT AS rejected_under_chaos,
       -- ties: the alphabetically first code
       first(reject_code ORDER BY n DESC, reject_code) FILTER (WHERE reject_code IS NOT NULL) AS top_reject_code
FROM per_code
GROUP BY tool
HAVING sum(n) >= $min_calls
ORDER BY error_rate DESC, calls DESC, tool
