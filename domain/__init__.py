"""CompanyOS pure domain: events, the three apps as deciders, tools, tasks, chaos, rewards.

No I/O, no wall clock, no process-dependent randomness. ``domain.episode`` is the contract
the rest of the system uses.
"""

from domain.chaos import CHAOS_LEVELS, parse_chaos
from domain.datahub import sim_time
from domain.episode import (
    INITIAL_STATE,
    EpisodeFinished,
    EpisodeSpec,
    EpisodeState,
    StepInfo,
    apply,
    fold,
    observe,
    reset,
    step,
    step_info,
    views,
)
from domain.events import EVENT_TYPES, from_envelope, to_envelope
from domain.outcomes import FAILURE_MODES
from domain.render import render_text
from domain.rewards import REWARD_PROFILES, RewardRule, reward_profile
from domain.rules import (
    CURRENT_RULES,
    RULES_VERSIONS,
    checked_rules,
    rules_from_text,
    rules_of,
    rules_standing,
    unknown_rules_text,
)
from domain.tasks import TASK_FAMILIES, task_family
from domain.tools import TOOLS, ToolSpec

__all__ = [
    "CHAOS_LEVELS", "CURRENT_RULES", "EVENT_TYPES", "FAILURE_MODES", "INITIAL_STATE",
    "REWARD_PROFILES", "RULES_VERSIONS", "TASK_FAMILIES", "TOOLS", "EpisodeFinished", "EpisodeSpec",
    "EpisodeState", "RewardRule", "StepInfo", "ToolSpec", "apply", "checked_rules", "fold",
    "from_envelope", "observe", "parse_chaos", "render_text", "reset", "reward_profile",
    "rules_from_text", "rules_of", "rules_standing", "sim_time", "step", "step_info", "task_family",
    "to_envelope", "unknown_rules_text", "views",
]
