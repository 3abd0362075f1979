"""Helpers for the pure-domain tests: run episodes in memory, no store."""

from __future__ import annotations

from companyos.agents import make_agent
from domain import EpisodeSpec, observe, reset, step


def play(task: str, seed: int, chaos, agent: str = "expert", agent_seed: int | None = None,
         profile: str = "default", max_steps: int | None = None, rules: int | None = None):
    """Run one episode; returns (final state, list of per-step event lists incl. reset)."""
    a = make_agent(agent, seed if agent_seed is None else agent_seed)
    s, events, info = reset(EpisodeSpec(task, seed, chaos, profile, max_steps, rules))
    obs = observe(s, info)
    a.reset(obs)
    steps = [events]
    while not s.done:
        s, events, info = step(s, a.act(obs))
        obs = observe(s, info)
        steps.append(events)
    return s, steps


def find_seed(task: str, chaos, predicate, limit: int = 400) -> int:
    """The first seed whose reset events satisfy predicate(events)."""
    for seed in range(limit):
        _, events, _ = reset(EpisodeSpec(task, seed, chaos))
        if predicate(events):
            return seed
    raise AssertionError("no seed found")



def act(app: str, method: str, **params) -> dict:
    """An action as an agent sends it."""
    return {"app": app, "method": method, "params": params}


def good_data(s) -> dict:
    """Every field the task's approval type requires, with the ticket's values and the metric's
    true value (hidden state: what a perfect agent would submit)."""
    tg = s.target
    required = s.world.approvalflow.types[tg["approval_type"]]["required_fields"]
    true = s.world.datahub.metrics[tg["metric"]]["true_value"]
    return {f: true if f == tg["field"] else tg["fields"][f] for f in required}
