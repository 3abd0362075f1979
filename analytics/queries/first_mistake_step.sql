-- At which step the rules first recorded a mistake, over finished episodes that had one, with its most common mode. A mistake is recorded where the rules can judge it (a ticket resolved while its priority was never raised), which can be steps after the move that caused it: read the steps before it (companyos replay) for the cause.
-- param agent VARCHAR = NULL: only episodes of this agent ((unknown): those logged without one)
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
WITH e AS (
    SELECT first_mistake_step AS step, first_mistake_mode AS mode
    FROM episodes
    WHERE outcome IS NOT NULL AND first_mistake_step IS NOT NULL
      AND ($agent IS NULL OR coalesce(agent, '(unknown)') = $agent)
      AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
      AND ($profile IS NULL OR reward_profile = $profile)
      AND ($rules IS NULL OR rules = $rules)
),
modes AS (SELECT step, mode, count(*) AS n FROM e WHERE mode IS NOT NULL GROUP BY ALL),
top AS (  -- ties: the alphabetically first mode
    SELECT step, first(mode ORDER BY n DESC, mode) AS mode FROM modes GROUP BY step
)
SELECT e.step AS first_mistake_step,
       count(*) AS episodes,
       round_decimal(count(*) / sum(count(*)) OVER (), 6) AS share,
       round_decimal(sum(count(*)) OVER (ORDER BY e.step) / sum(count(*)) OVER (), 6) AS cumulative_share,
       any_value(top.mode) AS most_common_mode
FROM e LEFT JOIN top ON top.step = e.step
GROUP BY e.step
ORDER BY e.step
