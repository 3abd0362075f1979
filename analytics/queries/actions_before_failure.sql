-- The most common action sequences leading into each failure mode, over finished non-successful episodes: the last k tools up to the decisive step (the step whose mistake decided the failure mode, else the last step).
-- param agent VARCHAR = NULL: only episodes of this agent ((unknown): those logged without one)
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
-- param k INTEGER[1..5] = 3: tools per sequence
-- param top INTEGER[1..1000] = 5: sequences per failure mode
WITH failed AS (
    SELECT failure_mode,
           array_to_string(lead_in[greatest(len(lead_in) - $k + 1, 1):], ' > ')
               AS sequence
    FROM episodes
    WHERE outcome IS NOT NULL AND outcome <> 'success'
      AND ($agent IS NULL OR coalesce(agent, '(unknown)') = $agent)
      AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
      AND ($profile IS NULL OR reward_profile = $profile)
      AND ($rules IS NULL OR rules = $rules)
),
counted AS (
    SELECT coalesce(failure_mode, '(none recorded)') AS failure_mode,
           CASE WHEN sequence = '' THEN '(no actions)' ELSE sequence END AS sequence,
           count(*) AS episodes
    FROM failed GROUP BY ALL
)
SELECT failure_mode, sequence, episodes,
       round_decimal(episodes / sum(episodes) OVER (PARTITION BY failure_mode), 4) AS share_of_mode
FROM counted
QUALIFY row_number() OVER (PARTITION BY failure_mode ORDER BY episodes DESC, sequence) <= $top
ORDER BY sum(episodes) OVER (PARTITION BY failure_mode) DESC, failure_mode, episodes DESC, sequence
