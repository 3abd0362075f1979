-- How often each tool call is rejected, how many rejections chaos caused, and the most common rejection code.
-- param agent VARCHAR = NULL: only steps of this agent
-- param task TASK = NULL: only this task family
-- param min_calls INTEGER[0..] = 1: leave out tools called fewer times
SELECT tool,
       count(*) AS calls,
       count(*) FILTER (WHERE NOT accepted) AS rejected,
       round(count(*) FILTER (WHERE NOT accepted) / count(*), 4) AS error_rate,
       count(*) FILTER (WHERE reject_cause = 'chaos') AS chaos_rejections,
       count(*) FILTER (WHERE NOT accepted AND len(chaos_active) > 0) AS rejected_under_chaos,
       mode(reject_code) AS top_reject_code
FROM steps
WHERE ($agent IS NULL OR agent = $agent)
  AND ($task IS NULL OR task = $task)
GROUP BY tool
HAVING count(*) >= $min_calls
ORDER BY error_rate DESC, calls DESC, tool
