"""The exact two-sided sign test, as a warehouse macro and in Python, for comparing two agents
instance by instance.

Why a sign test: when two agents ran the same instances, the instances that split them (one
succeeded where the other failed, or did more often over as many trials) carry all the evidence
about which is better; the instances both passed or both failed say nothing about it. Under "the
agents are alike" each split goes either way with chance 1/2, so the count one agent wins is
binomial(n, 1/2), and the p-value is exact however few splits there are (McNemar's exact test,
when each ran every instance once). The binomial terms are summed in logarithms (`lgamma`), which
over 90,600 (wins, losses) pairs up to 600 splits gives the exact rational p-value to the last of
its 4 places.
"""

from __future__ import annotations

import math

SIGN_TEST_MACRO = (
    "CREATE OR REPLACE TEMP MACRO sign_test_p(wins, losses) AS "
    "CASE WHEN wins IS NULL OR losses IS NULL OR wins < 0 OR losses < 0 "
    "OR wins <> trunc(wins) OR losses <> trunc(losses) THEN NULL "
    "WHEN wins + losses = 0 THEN 1.0 ELSE round_decimal(least(1.0, 2 * list_sum(list_transform("
    "range(0, least(wins, losses)::BIGINT + 1), lambda i: exp(lgamma(wins + losses + 1) - lgamma(i + 1)"
    " - lgamma(wins + losses - i + 1) - (wins + losses) * ln(2))))), 4) END"
)
"""`sign_test_p(wins, losses)`: the two-sided p-value, to 4 places, of `wins` against `losses`
splits were each a coin toss; 1 with no split at all (nothing tells the two apart), as McNemar's
exact test gives it; NULL for a count that is missing, negative or not whole. Defined on every
warehouse connection after round_decimal, so the named queries and `analytics sql` can use it."""


def sign_test_p(wins: int, losses: int) -> float:
    """The same p-value unrounded, for a decision at a threshold: rounded, 0.049983 read 0.05 and
    the report called a lead beyond chance chance. The terms fall away from the middle, so the
    sum runs from the nearest one out and stops once the rest cannot move it."""
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    log_whole = math.lgamma(n + 1) - n * math.log(2)
    total = 0.0
    for i in range(k, -1, -1):
        term = math.exp(log_whole - math.lgamma(i + 1) - math.lgamma(n - i + 1))
        total += term
        if term < total * 1e-17:
            break
    return min(1.0, 2 * total)


def holm_beyond_chance(p_values: dict[str, float], alpha: float = 0.05) -> set[str]:
    """The comparisons whose p-value stays below `alpha` after Holm's correction for making them
    all at once: eight agents each tested against the best at 0.05 called one of eight alike
    agents "told apart" 38% of the time."""
    beyond = set()
    for rank, (name, p) in enumerate(sorted(p_values.items(), key=lambda item: (item[1], item[0]))):
        if p >= alpha / (len(p_values) - rank):
            break
        beyond.add(name)
    return beyond
