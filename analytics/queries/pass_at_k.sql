-- tau-bench pass^k per task: the chance that k independent trials of the same instance (task, seed, chaos) all succeed, estimated without bias from n >= k trials per instance as C(c,k)/C(n,k), averaged over instances.
-- param k INTEGER[1..64] = 4: largest k reported (rows for 1..k)
-- param agent VARCHAR = NULL: only episodes of this agent
-- param task TASK = NULL: only this task family
WITH trials AS (
    SELECT coalesce(agent, '(unknown)') AS agent, task, seed, chaos,
           count(*) AS n, count(*) FILTER (WHERE outcome = 'success') AS c
    FROM episodes
    WHERE outcome IS NOT NULL
      AND ($agent IS NULL OR agent = $agent)
      AND ($task IS NULL OR task = $task)
    GROUP BY ALL
),
ks AS (SELECT range AS k FROM range(1, $k + 1))
SELECT t.agent, t.task, ks.k,
       count(*) AS instances,
       round(avg(t.n), 2) AS mean_trials,
       round(avg(CASE WHEN t.c < ks.k THEN 0.0
                      ELSE exp(lgamma(t.c + 1) - lgamma(t.c - ks.k + 1)
                               - lgamma(t.n + 1) + lgamma(t.n - ks.k + 1)) END), 4) AS pass_hat_k
FROM trials t JOIN ks ON t.n >= ks.k
GROUP BY t.agent, t.task, ks.k
ORDER BY t.agent, t.task, ks.k
