-- How often each tool call is rejected in finished episodes, how many rejections chaos caused, and the most common rejection code.
-- param agent VARCHAR = NULL: only steps of this agent
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
-- param min_calls INTEGER[0..] = 1: leave out tools called fewer times

-- one pass over the steps, per (tool, code); tools and their top code come from these few rows
WITH s AS (
    SELECT tool, accepted, reject_cause, reject_code, chaos_active
    FROM steps
    -- running episodes are few: leaving them out is cheaper than joining the finished ones (a
    -- profile or rules version asked for leaves out the others' episodes the same way)
    ANTI JOIN (SELECT episode_id FROM episodes
               WHERE outcome IS NULL OR ($profile IS NOT NULL AND reward_profile IS DISTINCT FROM $profile)
                  OR ($rules IS NOT NULL AND rules IS DISTINCT FROM $rules))
         left_out USING (episode_id)
    WHERE ($agent IS NULL OR coalesce(agent, '(unknown)') = $agent)
      AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
),
-- counts per tool over every call; codes and the chaos in force only over the rejected ones
-- (a quarter of the calls): grouping every call by its code cost most of the query
per_tool AS (
    SELECT tool, count(*) AS calls, count(*) FILTER (WHERE NOT accepted) AS rejected,
           count(*) FILTER (WHERE reject_cause = 'chaos') AS chaos_rejections
    FROM s GROUP BY tool
),
per_code AS (
    SELECT tool, reject_code, count(*) AS n, count(*) FILTER (WHERE len(chaos_active) > 0) AS under_chaos
    FROM s WHERE NOT accepted GROUP BY ALL
),
rejections AS (
    SELECT tool, sum(under_chaos)::BIGINT AS under_chaos,
           -- ties: the alphabetically first code
           first(reject_code ORDER BY n DESC, reject_code) FILTER (WHERE reject_code IS NOT NULL) AS code
    FROM per_code GROUP BY tool
)
SELECT p.tool, p.calls, p.rejected,
       round_decimal(p.rejected / p.calls, 4) AS error_rate,
       p.chaos_rejections,
       coalesce(r.under_chaos, 0) AS rejected_under_chaos,
       r.code AS top_reject_code
FROM per_tool p LEFT JOIN rejections r ON r.tool IS NOT DISTINCT FROM p.tool
WHERE p.calls >= $min_calls
ORDER BY error_rate DESC, calls DESC, p.tool
