-- What separates agents: success, return, steps, first mistake and rejected calls (the agent's own invalid ones and chaos's refusals alike) per agent, with each agent's most common failure mode and the rules versions its episodes were judged by.
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
WITH e AS (
    SELECT * FROM episodes
    WHERE outcome IS NOT NULL
      AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
      AND ($profile IS NULL OR reward_profile = $profile)
      AND ($rules IS NULL OR rules = $rules)
),
modes AS (
    SELECT agent, failure_mode, count(*) AS n FROM e
    WHERE outcome <> 'success' AND failure_mode IS NOT NULL GROUP BY ALL
),
top AS (  -- ties: the alphabetically first mode
    SELECT agent, first(failure_mode ORDER BY n DESC, failure_mode) AS mode FROM modes GROUP BY agent
)
SELECT coalesce(e.agent, '(unknown)') AS agent,
       -- the versions its episodes were judged by: agents judged by different ones compare unlike
       list(DISTINCT e.rules ORDER BY e.rules) AS rules,
       count(*) AS episodes,
       count(*) FILTER (WHERE outcome = 'success') AS successes,
       round_decimal(count(*) FILTER (WHERE outcome = 'success') / count(*), 4) AS success_rate,
       round_decimal(avg(total_return::DECIMAL(18, 6)), 3) AS mean_return,
       round_decimal(coalesce(stddev_samp(total_return), 0), 3) AS std_return,
       round_decimal(avg(steps), 2) AS mean_steps,
       round_decimal(avg(first_mistake_step), 2) AS mean_first_mistake_step,
       round_decimal(sum(rejected_actions) / nullif(sum(steps), 0), 4) AS rejected_action_rate,
       any_value(top.mode) AS top_failure_mode
FROM e LEFT JOIN top ON top.agent IS NOT DISTINCT FROM e.agent
GROUP BY e.agent
ORDER BY success_rate DESC, agent
