"""The task families: generators from (seed, chaos) to an initial world, a goal, hidden
success criteria and a step budget."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from domain.tasks import (
    bug_escalation,
    expense_report,
    handbook_update,
    license_renewal,
    vendor_onboarding,
)
from domain.tasks.common import Instance, generate


class TaskFamily(NamedTuple):
    name: str
    description: str  # one line, for `companyos tasks`
    generate: Callable[..., Instance]  # (seed, chaos level, status_under_block=True)


TASK_FAMILIES: dict[str, TaskFamily] = {
    m.FAMILY.name: TaskFamily(m.FAMILY.name, m.FAMILY.description, partial(generate, m.FAMILY))
    for m in (vendor_onboarding, expense_report, bug_escalation, license_renewal,
              handbook_update)
}


def task_family(name: str) -> TaskFamily:
    """The family called `name`; a ValueError naming every family otherwise (the one check of a
    task name, for the episode's reset and for every filter on logged episodes)."""
    family = TASK_FAMILIES.get(name) if isinstance(name, str) else None
    if family is None:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASK_FAMILIES)}")
    return family


__all__ = ["TASK_FAMILIES", "TaskFamily", "Instance", "task_family"]
