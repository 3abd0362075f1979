-- Where the return comes from: grants and value per reward rule over finished episodes, per episode on average.
-- param agent VARCHAR = NULL: only episodes of this agent ((unknown): those logged without one)
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
WITH e AS (
    SELECT episode_id FROM episodes
    WHERE outcome IS NOT NULL
      AND ($agent IS NULL OR coalesce(agent, '(unknown)') = $agent) AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
      AND ($profile IS NULL OR reward_profile = $profile)
      AND ($rules IS NULL OR rules = $rules)
),
n AS (SELECT count(*) AS episodes FROM e)
SELECT r.rule,
       sum(r.grants) AS grants,
       count(*) AS episodes_granted,
       round_decimal(count(*) / any_value(n.episodes), 4) AS share_of_episodes,
       round_decimal(sum(r.total::DECIMAL(18, 6)), 3) AS total_value,
       round_decimal(sum(r.total::DECIMAL(18, 6)) / any_value(n.episodes), 4) AS mean_value_per_episode
FROM rewards r SEMI JOIN e ON e.episode_id = r.episode_id
CROSS JOIN n
GROUP BY r.rule
ORDER BY abs(sum(r.total::DECIMAL(18, 6))) DESC, r.rule
