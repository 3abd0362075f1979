"""Text rendering of an observation for LLM agents (lazy: bulk runs never call it)."""

from __future__ import annotations

import json


def render_text(observation: dict) -> str:
    """A plain-text view of an observation dict produced by ``episode.observe``."""
    lines = [f"GOAL: {observation.get('goal', '')}",
             f"STEP {observation.get('step', 0)} ({observation.get('steps_remaining', 0)} "
             "steps left)"]
    if observation.get("error"):
        lines.append(f"ERROR [{observation['error']}]: {observation.get('message', '')}")
    elif observation.get("message"):
        lines.append(f"MESSAGE: {observation['message']}")
    result = observation.get("result")
    if result is not None:
        if isinstance(result, dict):
            warnings = result.get("warnings") or []
            for w in warnings:
                lines.append(f"WARNING: {w}")
            result = {k: v for k, v in result.items() if k != "warnings"}
        lines.append("RESULT:")
        lines.append(json.dumps(result, indent=2, sort_keys=False, ensure_ascii=False))
    if observation.get("done"):
        lines.append(f"EPISODE OVER: {observation.get('outcome')}")
    return "\n".join(lines)
