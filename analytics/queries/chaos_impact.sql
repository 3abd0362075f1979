-- Which chaos trap hurts: success rate of finished episodes in which each chaos mechanism fired, against those in which it did not.
-- param agent VARCHAR = NULL: only episodes of this agent ((unknown): those logged without one)
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
WITH e AS (
    SELECT chaos_mechanisms, outcome = 'success' AS ok
    FROM episodes
    WHERE outcome IS NOT NULL
      AND ($agent IS NULL OR coalesce(agent, '(unknown)') = $agent)
      AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
      AND ($profile IS NULL OR reward_profile = $profile)
      AND ($rules IS NULL OR rules = $rules)
),
total AS (SELECT count(*) AS n, count(*) FILTER (WHERE ok) AS s FROM e),
fired AS (SELECT unnest(chaos_mechanisms) AS mechanism, ok FROM e)
SELECT f.mechanism,
       count(*) AS episodes_with,
       round_decimal(count(*) FILTER (WHERE f.ok) / count(*), 4) AS success_rate_with,
       any_value(t.n) - count(*) AS episodes_without,
       round_decimal((any_value(t.s) - count(*) FILTER (WHERE f.ok)) / nullif(any_value(t.n) - count(*), 0), 4)
           AS success_rate_without,
       round_decimal(count(*) FILTER (WHERE f.ok) / count(*)
             - (any_value(t.s) - count(*) FILTER (WHERE f.ok)) / nullif(any_value(t.n) - count(*), 0), 4)
           AS success_rate_delta
FROM fired f CROSS JOIN total t
GROUP BY f.mechanism
ORDER BY success_rate_delta NULLS LAST, f.mechanism
