-- tau-bench pass^k per agent and task: the chance that k independent trials of one instance (task, seed, chaos, step budget, reward profile, rules version) all succeed, C(c,k)/C(n,k) averaged for every k up to the requested one over the same instances, those with at least that many trials (the others are counted in instances_left_out).
-- param k INTEGER[1..64] = 4: largest k reported (rows for 1..k)
-- param agent VARCHAR = NULL: only episodes of this agent ((unknown): those logged without one)
-- param task TASK = NULL: only this task family
-- param chaos CHAOS = NULL: only this chaos level (none, low, medium, high or a number)
-- param profile PROFILE = NULL: only episodes scored by this reward profile (default or sparse)
-- param rules RULES = NULL: only episodes judged by this rules version (1, 2, ...)
WITH trials AS (
    SELECT coalesce(agent, '(unknown)') AS agent, task, seed, chaos, max_steps, reward_profile, rules,
           count(*) AS n, count(*) FILTER (WHERE outcome = 'success') AS c
    FROM episodes
    WHERE outcome IS NOT NULL
      AND ($agent IS NULL OR coalesce(agent, '(unknown)') = $agent)
      AND ($task IS NULL OR task = $task)
      AND ($chaos IS NULL OR chaos = $chaos)
      AND ($profile IS NULL OR reward_profile = $profile)
      AND ($rules IS NULL OR rules = $rules)
    GROUP BY ALL
),
pairs AS (
    SELECT agent, task, count(*) FILTER (WHERE n >= $k) AS instances,
           count(*) FILTER (WHERE n < $k) AS instances_left_out
    FROM trials GROUP BY agent, task
),
ks AS (SELECT range AS k FROM range(1, $k + 1)),
-- C(c,k)/C(n,k) for k = 1, 2, ... as a running product of (c-k+1)/(n-k+1): exact for k = 1 (c/n),
-- where exp(lgamma(...)) made 3/4 0.7499999999999998; 0 from k = c+1 on
chances AS (
    SELECT t.agent, t.task, t.n, ks.k,
           product((t.c - ks.k + 1) / (t.n - ks.k + 1)) OVER (
               PARTITION BY t.agent, t.task, t.seed, t.chaos, t.max_steps, t.reward_profile, t.rules
               ORDER BY ks.k ROWS UNBOUNDED PRECEDING) AS chance
    FROM trials t CROSS JOIN ks
    WHERE t.n >= $k
),
passes AS (
    SELECT agent, task, k,
           round_decimal(avg(n), 2) AS mean_trials,
           round_decimal(avg(greatest(chance, 0.0)), 4) AS pass_hat_k
    FROM chances
    GROUP BY agent, task, k
)
SELECT p.agent, p.task, ks.k, p.instances, p.instances_left_out, x.mean_trials, x.pass_hat_k
FROM pairs p CROSS JOIN ks
LEFT JOIN passes x ON x.agent = p.agent AND x.task IS NOT DISTINCT FROM p.task AND x.k = ks.k
ORDER BY p.agent, p.task, ks.k
