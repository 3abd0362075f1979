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
codes AS (SELECT tool, reject_code, count(*) AS n FROM s WHERE reject_code IS NOT NULL GROUP BY ALL),
top AS (  -- ties: the alphabetically first code
    SELECT tool, first(reject_code ORDER BY n DESC, reject_code) AS code FROM codes GROUP BY tool
)
SELECT s.tool,
       count(*) AS calls,
       count(*) FILTER (WHERE NOT accepted) AS rejected,
       round(count(*) FILTER (WHERE NOT accepted) / count(*), 4) AS error_rate,
       count(*) FILTER (WHERE reject_cause = 'chaos') AS chaos_rejections,
       count(*) FILTER (WHERE NOT accepted AND len(chaos_active) > 0) AS rejected_under_chaos,
       any_value(top.code) AS top_reject_code
FROM s LEFT JOIN top ON top.tool IS NOT DISTINCT FROM s.tool
GROUP BY s.tool
HAVING count(*) >= $min_calls
ORDER BY error_rate DESC, calls DESC, s.tool
