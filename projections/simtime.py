"""Simulated time of a step: the domain's fixed simulated date plus the step clock.

The domain keeps time as a date (`domain.datahub.TODAY`) and a step counter; the read models
show it as an ISO time, counting one simulated minute per step from 09:00 of that date. If the
domain ever defines `domain.sim_time(step)`, that definition wins.
"""

from __future__ import annotations

import datetime as dt

import domain
from domain.datahub import TODAY

_clock = getattr(domain, "sim_time", None)
_EPOCH = dt.datetime.fromisoformat(TODAY).replace(hour=9, tzinfo=dt.UTC)


def sim_time(step: int) -> str:
    """ISO time of `step` on the simulated clock."""
    if _clock is not None:
        return _clock(step)
    return (_EPOCH + dt.timedelta(minutes=step)).isoformat()
