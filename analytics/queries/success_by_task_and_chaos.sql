-- Success rate per task family and chaos level, over finished episodes.
-- param agent VARCHAR = NULL: only episodes of this agent
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
SELECT task,
       chaos,
       count(*) AS episodes,
       count(*) FILTER (WHERE outcome = 'success') AS successes,
       round_decimal(count(*) FILTER (WHERE outcome = 'success') / count(*), 4) AS success_rate,
       round_decimal(avg(total_return::DECIMAL(18, 6)), 3) AS mean_return
FROM episodes
WHERE outcome IS NOT NULL
  AND ($agent IS NULL OR agent = $agent)
  AND ($task IS NULL OR task = $task)
  AND ($chaos IS NULL OR chaos = $chaos)
  AND ($profile IS NULL OR reward_profile = $profile)
  AND ($rules IS NULL OR rules = $rules)
GROUP BY task, chaos
ORDER BY task, chaos
