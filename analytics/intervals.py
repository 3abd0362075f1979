"""The 95% Wilson score interval of a success rate, in SQL (for the named queries) and in Python
(for rates summed outside SQL, and for `companyos run`'s summary), giving the same numbers.

Why Wilson: 50 episodes at 62% and 50 at 58% are not two agents of different skill, and a rate
shown without its uncertainty invites that reading. The normal ("Wald") interval collapses to a
point at 0 and 100% successes and strays below 0 or above 1 near them; Wilson's stays inside
[0, 1] and keeps its coverage for the small counts agents are often compared on.

Why instances: the interval is counted over distinct instances (task, seed, chaos level, step
budget, reward profile, rules version), with the rate over every episode. A seed run again is no
new evidence about the seeds an agent was not run on (a deterministic agent replays the very same
episode), and counting its repeats as independent trials narrowed the interval ten runs over until
two agents with the same flaw read as told apart.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

Z95 = 1.959963984540054
"""The standard normal's 97.5th percentile: a two-sided 95% interval."""

_Z2 = Z95 * Z95


def wilson_bounds(successes: int, episodes: int, instances: int | None = None) -> tuple[float, float]:
    """(low, high) of the 95% Wilson interval of successes/episodes counted over `instances`
    (default: every episode is its own), unrounded; (0.0, 1.0) for none. The operations are those
    of `WILSON_MACROS`, in the same order, so both give the same doubles."""
    trials = episodes if instances is None else instances
    if trials <= 0 or episodes <= 0:
        return 0.0, 1.0
    hits = successes if instances is None else successes * instances / episodes
    p = hits / trials
    denominator = 1 + _Z2 / trials
    centre = p + _Z2 / (2 * trials)
    half = Z95 * math.sqrt(p * (1 - p) / trials + _Z2 / (4 * trials * trials))
    return max((centre - half) / denominator, 0.0), min((centre + half) / denominator, 1.0)


def rounded(value: float, places: int = 4) -> float:
    """`value` rounded as the warehouse's round_decimal rounds it (half up, after 12 places)."""
    twelve = Decimal(value).quantize(Decimal("1e-12"), ROUND_HALF_UP)
    return float(twelve.quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP))


def wilson_interval(successes: int, episodes: int,
                    instances: int | None = None) -> tuple[float | None, float | None]:
    """(low, high) to 4 places, as the named queries' `success_rate_low`/`_high` columns give it;
    (None, None) for no episodes (or instances), where there is no rate either."""
    if episodes <= 0 or (instances is not None and instances <= 0):
        return None, None
    low, high = wilson_bounds(successes, episodes, instances)
    return rounded(low), rounded(high)


def _bound(sign: str) -> str:
    # k: the trials the interval counts; p: the rate over every episode
    z, z2, k = f"{Z95!r}::DOUBLE", f"{_Z2!r}::DOUBLE", "coalesce(instances, n)"  # literals: DECIMAL
    p = f"(((s * {k}) / n) / {k})"
    return (f"(({p} + {z2} / (2 * {k})) {sign} {z} * "
            f"sqrt({p} * (1 - {p}) / {k} + {z2} / (4 * {k}::DOUBLE * {k}))) / (1 + {z2} / {k})")


WILSON_MACROS = (
    "CREATE OR REPLACE TEMP MACRO success_rate_low(s, n, instances := NULL) AS "
    f"CASE WHEN n > 0 AND coalesce(instances, n) > 0 THEN round_decimal(greatest({_bound('-')}, 0), 4) END",
    "CREATE OR REPLACE TEMP MACRO success_rate_high(s, n, instances := NULL) AS "
    f"CASE WHEN n > 0 AND coalesce(instances, n) > 0 THEN round_decimal(least({_bound('+')}, 1), 4) END",
)
"""`success_rate_low(successes, episodes[, instances := k])` and `success_rate_high(...)`: the 95%
Wilson interval's bounds to 4 places, NULL for no episodes or instances; defined on every warehouse connection
after round_decimal, so the named queries and `analytics sql` can use them."""


def percent_text(fraction: float, places: int = 1) -> str:
    """A fraction as a percentage rounded as the queries round (half away from zero): f"{x:.1%}"
    rounds the binary value half to even, so 0.3125 read 31.2% where 0.6125 read 61.3%."""
    return f"{percent_value(fraction, places)}%"


def percent_value(fraction: float, places: int) -> Decimal:
    """The percentage `percent_text` writes, as a Decimal."""
    return (Decimal(str(fraction)) * 100).quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP)
