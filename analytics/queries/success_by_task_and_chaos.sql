-- Success rate per task family and chaos level, over finished episodes, with its 95% interval.
-- param agent VARCHAR = NULL: only episodes of this agent ((unknown): those logged without one)
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
SELECT task, chaos, episodes, instances, successes,
       round_decimal(successes / episodes, 4) AS success_rate,
       -- its 95% Wilson interval over the instances (a seed run again is one)
       success_rate_low(successes, episodes, instances := instances) AS success_rate_low,
       success_rate_high(successes, episodes, instances := instances) AS success_rate_high,
       round_decimal(mean_return, 3) AS mean_return
FROM (
    SELECT task, chaos,
           count(*) AS episodes,
           count(DISTINCT (coalesce(agent, '(unknown)'), seed, max_steps, reward_profile, rules)) AS instances,
           count(*) FILTER (WHERE outcome = 'success') AS successes,
           avg(total_return::DECIMAL(18, 6)) AS mean_return
    FROM episodes
    WHERE outcome IS NOT NULL
      AND ($agent IS NULL OR coalesce(agent, '(unknown)') = $agent)
      AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
      AND ($profile IS NULL OR reward_profile = $profile)
      AND ($rules IS NULL OR rules = $rules)
    GROUP BY task, chaos
)
ORDER BY task, chaos
