"""The task catalogue as one document: what `GET /tasks` serves and `companyos tasks --json` prints,
so a script reads the same shape from either."""

from __future__ import annotations

from functools import cache
from typing import Any

import domain


@cache
def task_catalogue() -> dict[str, Any]:
    return {
        "tasks": [{"name": f.name, "description": f.description}
                  for f in domain.TASK_FAMILIES.values()],
        "chaos_levels": dict(domain.CHAOS_LEVELS),
        "reward_profiles": list(domain.REWARD_PROFILES),
        "rules_versions": [{"version": v, "description": text} for v, text in domain.RULES_VERSIONS.items()],
        "current_rules": domain.CURRENT_RULES,
        "failure_modes": dict(domain.FAILURE_MODES),
    }
