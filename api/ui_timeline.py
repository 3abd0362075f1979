"""An episode's story step by step, folded from its events as the log holds them.

The timeline is built from the events alone (no replay, no simulator) so that what the page says
is exactly what the log recorded: step K is its `ActionTaken` and every event up to the next one,
the same boundaries `projections.replay` uses for time travel. Step 0 is the reset: the world
being built, including the chaos planted before the agent's first move.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from domain.events import CHAOS

# Facts the timeline shows in their own columns; every other event of a step is an "effect".
_OWN_COLUMNS = frozenset({"ActionTaken", "ActionRejected", "RewardGranted", "MistakeRecorded",
                          "EpisodeEnded", "EpisodeStarted"})


@dataclass
class Step:
    """One step of the timeline (step 0: the reset)."""

    step: int
    action: Any = None  # exactly what the agent sent (None for step 0)
    rejected: dict[str, Any] | None = None  # the ActionRejected data: code, reason, cause, mechanism
    rewards: list[dict[str, Any]] = field(default_factory=list)  # RewardGranted data: rule, value
    mistakes: list[dict[str, Any]] = field(default_factory=list)  # MistakeRecorded data
    chaos: list[dict[str, Any]] = field(default_factory=list)  # {"type", "mechanism", "data"}
    effects: list[dict[str, Any]] = field(default_factory=list)  # {"type", "data"}: other facts
    ended: dict[str, Any] | None = None  # the EpisodeEnded data, on the step that ended it
    events: int = 0

    @property
    def tool(self) -> str | None:
        """`app.method` of a well-formed action; None for a malformed one (or step 0)."""
        action = self.action
        if isinstance(action, dict) and isinstance(action.get("app"), str) \
                and isinstance(action.get("method"), str):
            return f"{action['app']}.{action['method']}"
        return None

    @property
    def arguments(self) -> Any:
        """The action's params when it is well formed; else the whole action as sent."""
        if self.tool is not None:
            return self.action.get("params", {})
        return self.action

    @property
    def reward(self) -> float:
        return sum(float(r.get("value", 0.0)) for r in self.rewards)


def build_timeline(events: list[dict[str, Any]]) -> list[Step]:
    """Steps 0..N from an episode's events (dicts with `type` and `data`, in stream order)."""
    steps = [Step(step=0)]
    for event in events:
        kind = event["type"]
        data = event.get("data")
        if not isinstance(data, dict):
            data = {}
        if kind == "ActionTaken":
            steps.append(Step(step=data.get("step", len(steps)), action=data.get("action")))
        current = steps[-1]
        current.events += 1
        if kind == "ActionRejected":
            current.rejected = data
        elif kind == "RewardGranted":
            current.rewards.append(data)
        elif kind == "MistakeRecorded":
            current.mistakes.append(data)
        elif kind == "EpisodeEnded":
            current.ended = data
        if data.get("cause") == CHAOS:  # the parsed field, never a search of the text
            current.chaos.append({"type": kind, "mechanism": data.get("mechanism"), "data": data})
        elif kind not in _OWN_COLUMNS and current.step > 0:
            current.effects.append({"type": kind, "data": data})
    return steps
