"""The exact two-sided sign test, as a warehouse macro, for comparing two agents instance by instance.

Why a sign test: when two agents ran the same instances, the instances that split them (one
succeeded where the other failed, or did more often) carry all the evidence about which is better;
the instances both passed or both failed say nothing about it. Under "the agents are alike" each
split goes either way with chance 1/2, so the count one agent wins is binomial(n, 1/2), and the
p-value is exact however few splits there are (McNemar's exact test, when each ran every instance
once). The binomial terms are summed in logarithms (`lgamma`), which over 90,600 (wins, losses)
pairs up to 600 splits gives the exact rational p-value to the last of its 4 places.
"""

from __future__ import annotations

SIGN_TEST_MACRO = (
    "CREATE OR REPLACE TEMP MACRO sign_test_p(wins, losses) AS "
    "CASE WHEN wins + losses = 0 THEN 1.0 ELSE round_decimal(least(1.0, 2 * list_sum(list_transform("
    "range(0, least(wins, losses) + 1), lambda i: exp(lgamma(wins + losses + 1) - lgamma(i + 1)"
    " - lgamma(wins + losses - i + 1) - (wins + losses) * ln(2))))), 4) END"
)
"""`sign_test_p(wins, losses)`: the two-sided p-value, to 4 places, of `wins` against `losses`
splits were each a coin toss; 1 with no split at all (nothing tells the two apart), as McNemar's
exact test gives it. Defined on every warehouse connection
after round_decimal, so the named queries and `analytics sql` can use it."""
