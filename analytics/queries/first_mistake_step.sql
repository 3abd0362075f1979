-- At which step agents first go wrong: the distribution of the first recorded mistake's step, with its most common mode.
-- param agent VARCHAR = NULL: only episodes of this agent
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
WITH e AS (
    SELECT first_mistake_step AS step, first_mistake_mode AS mode
    FROM episodes
    WHERE first_mistake_step IS NOT NULL
      AND ($agent IS NULL OR agent = $agent)
      AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
)
SELECT step AS first_mistake_step,
       count(*) AS episodes,
       round(count(*) / sum(count(*)) OVER (), 6) AS share,
       round(sum(count(*)) OVER (ORDER BY step) / sum(count(*)) OVER (), 6) AS cumulative_share,
       mode(mode) AS most_common_mode
FROM e
GROUP BY step
ORDER BY step
