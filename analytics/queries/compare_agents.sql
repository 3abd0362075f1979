-- What separates agents: success (with its 95% interval), return, steps, first mistake and rejected calls (the agent's own invalid ones and chaos's refusals alike) per agent, with each agent's most common failure mode and the rules versions its episodes were judged by.
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
    SELECT coalesce(agent, '(unknown)') AS agent, failure_mode, count(*) AS n FROM e
    WHERE outcome <> 'success' AND failure_mode IS NOT NULL GROUP BY ALL
),
top AS (  -- ties: the alphabetically first mode
    SELECT agent, first(failure_mode ORDER BY n DESC, failure_mode) AS mode FROM modes GROUP BY agent
),
agg AS (
    SELECT coalesce(e.agent, '(unknown)') AS agent,
           -- the versions its episodes were judged by: agents judged by different ones compare unlike
           list(DISTINCT e.rules ORDER BY e.rules) AS rules,
           -- and the chaos levels it ran at: an agent run only at chaos none is not ahead of one
           -- run only at high
           list(DISTINCT e.chaos ORDER BY e.chaos) AS chaos_levels,
           count(*) AS episodes,
           -- as pass_at_k counts them: a seed run again is one instance, however many its trials
           count(DISTINCT (e.task, e.seed, e.chaos, e.max_steps, e.reward_profile, e.rules)) AS instances,
           count(*) FILTER (WHERE outcome = 'success') AS successes,
           avg(total_return::DECIMAL(18, 6)) AS mean_return,
           coalesce(stddev_samp(total_return), 0) AS std_return,
           avg(steps) AS mean_steps,
           count(first_mistake_step) AS episodes_with_mistake,
           avg(first_mistake_step) AS mean_first_mistake_step,
           sum(rejected_actions) / nullif(sum(steps), 0) AS rejected_action_rate,
           any_value(top.mode) AS top_failure_mode
    -- by the name every filter finds: an old release's literal "(unknown)" label pools with the
    -- unlabelled episodes, as `-p agent=(unknown)` selects them (it was a second "(unknown)" row)
    FROM e LEFT JOIN top ON top.agent = coalesce(e.agent, '(unknown)')
    GROUP BY coalesce(e.agent, '(unknown)')
)
SELECT agent, rules, chaos_levels, episodes, instances, successes,
       round_decimal(successes / episodes, 4) AS success_rate,
       -- its 95% Wilson interval over the instances: agents whose intervals overlap may differ by
       -- chance alone
       success_rate_low(successes, episodes, instances := instances) AS success_rate_low,
       success_rate_high(successes, episodes, instances := instances) AS success_rate_high,
       round_decimal(mean_return, 3) AS mean_return,
       round_decimal(std_return, 3) AS std_return,
       round_decimal(mean_steps, 2) AS mean_steps,
       episodes_with_mistake,
       round_decimal(mean_first_mistake_step, 2) AS mean_first_mistake_step,
       round_decimal(rejected_action_rate, 4) AS rejected_action_rate,
       top_failure_mode
FROM agg
ORDER BY success_rate DESC, agent
