-- Why episodes fail: each failure mode's share of the finished, non-successful episodes (shares sum to 1 within rounding to 6 decimals), with example episode ids.
-- param agent VARCHAR = NULL: only episodes of this agent ((unknown): those logged without one)
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
-- param examples INTEGER[0..100] = 3: example episode ids per failure mode
WITH failed AS (
    SELECT episode_id, failure_mode, first_position
    FROM episodes
    WHERE outcome IS NOT NULL AND outcome <> 'success'
      AND ($agent IS NULL OR coalesce(agent, '(unknown)') = $agent)
      AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
      AND ($profile IS NULL OR reward_profile = $profile)
      AND ($rules IS NULL OR rules = $rules)
)
SELECT coalesce(failure_mode, '(none recorded)') AS failure_mode,
       count(*) AS episodes,
       round_decimal(count(*) / sum(count(*)) OVER (), 6) AS share,
       list(episode_id ORDER BY first_position)[1:$examples] AS example_episode_ids
FROM failed
GROUP BY failure_mode
ORDER BY episodes DESC, failure_mode
