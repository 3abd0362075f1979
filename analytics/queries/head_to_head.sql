-- Whether one agent beats another on the same ground: over the instances (task, seed, chaos level, step budget, reward profile, rules version) both ran, on how many each succeeded more often, and the exact two-sided sign test of that split (McNemar's exact test when each ran every instance once). Seed set beside seed, the seeds' difficulty cancels out, so a paired count tells agents apart where two success rates and their intervals cannot; and agents run on different seeds, chaos levels or tasks are compared only where they met. Where one agent ran an instance more often, only each agent's first trials of it count, as many as the other ran: one trial against three, the single one wins on an easy seed and loses on a hard one more often than not, and alike agents read as different.
-- param agent VARCHAR: the agent compared ((unknown): the episodes logged without one)
-- param other VARCHAR = NULL: the agent it is compared with (default: each other agent in turn)
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
WITH trials AS (  -- each agent's outcomes on each instance, in the order they were logged
    SELECT coalesce(agent, '(unknown)') AS agent, task, seed, chaos, max_steps, reward_profile, rules,
           list(outcome = 'success' ORDER BY first_position) AS oks
    FROM episodes
    WHERE outcome IS NOT NULL
      AND ($other IS NULL OR coalesce(agent, '(unknown)') IN ($agent, $other))
      AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
      AND ($profile IS NULL OR reward_profile = $profile)
      AND ($rules IS NULL OR rules = $rules)
    GROUP BY ALL
),
met AS (  -- the instances both ran; an old log's unstated chaos or budget matches its like
    SELECT o.agent AS other, a.task, a.oks AS agent_oks, o.oks AS other_oks,
           least(len(a.oks), len(o.oks)) AS m  -- the trials each side counts
    FROM trials a JOIN trials o
      ON a.task IS NOT DISTINCT FROM o.task AND a.seed IS NOT DISTINCT FROM o.seed
     AND a.chaos IS NOT DISTINCT FROM o.chaos AND a.max_steps IS NOT DISTINCT FROM o.max_steps
     AND a.reward_profile IS NOT DISTINCT FROM o.reward_profile AND a.rules IS NOT DISTINCT FROM o.rules
    WHERE a.agent = $agent AND o.agent <> $agent
),
paired AS (
    SELECT other, task, m,
           list_sum(agent_oks[1:m]::INTEGER[]) AS agent_wins,
           list_sum(other_oks[1:m]::INTEGER[]) AS other_wins
    FROM met
),
split AS (
    SELECT other, grouping(task) = 1 AS every_task, task,
           count(*) AS instances, sum(m) AS trials,
           count(*) FILTER (WHERE agent_wins > other_wins) AS agent_ahead,
           count(*) FILTER (WHERE agent_wins < other_wins) AS other_ahead,
           count(*) FILTER (WHERE agent_wins = other_wins) AS even,
           avg(agent_wins / m) AS agent_rate, avg(other_wins / m) AS other_rate
    FROM paired
    GROUP BY GROUPING SETS ((other), (other, task))
)
SELECT $agent AS agent, other, CASE WHEN every_task THEN '(all)' ELSE task END AS task,
       instances, trials, agent_ahead, other_ahead, even,
       -- over the trials compared, each instance weighing the same
       round_decimal(agent_rate, 4) AS agent_success_rate,
       round_decimal(other_rate, 4) AS other_success_rate,
       round_decimal(agent_rate - other_rate, 4) AS difference,
       -- the chance of a split at least this uneven were the two agents alike
       sign_test_p(agent_ahead, other_ahead) AS p_value
FROM split
ORDER BY other, every_task DESC, task
