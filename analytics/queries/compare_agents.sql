-- What separates agents: success, return, steps, first mistake and invalid calls per agent, with each agent's most common failure mode.
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
SELECT coalesce(agent, '(unknown)') AS agent,
       count(*) AS episodes,
       round(count(*) FILTER (WHERE outcome = 'success') / count(*), 4) AS success_rate,
       round(avg(total_return), 3) AS mean_return,
       round(coalesce(stddev_samp(total_return), 0), 3) AS std_return,
       round(avg(steps), 2) AS mean_steps,
       round(avg(first_mistake_step), 2) AS mean_first_mistake_step,
       round(sum(rejected_actions) / nullif(sum(steps), 0), 4) AS rejected_action_rate,
       mode(failure_mode) FILTER (WHERE outcome <> 'success') AS top_failure_mode
FROM episodes
WHERE outcome IS NOT NULL
  AND ($task IS NULL OR task = $task)
  AND ($chaos IS NULL OR chaos = $chaos)
GROUP BY agent
ORDER BY success_rate DESC, agent
