"""Baseline agents: ``random``, ``noop`` and ``expert``.

An agent has ``name``, ``reset(observation) -> None`` and ``act(observation) -> dict``; it
sees only observations (``domain.observe``), never the hidden state or the store.
"""

from __future__ import annotations

from typing import Protocol

from companyos.agents.expert import ExpertAgent
from companyos.agents.noop import NoopAgent
from companyos.agents.random_agent import RandomAgent


class Agent(Protocol):
    name: str

    def reset(self, observation: dict) -> None: ...

    def act(self, observation: dict) -> dict: ...


AGENTS = {"random": RandomAgent, "noop": NoopAgent, "expert": ExpertAgent}


def make_agent(name: str, seed: int = 0) -> Agent:
    """A fresh agent by name; ``seed`` seeds its own random.Random where it has one."""
    cls = AGENTS.get(name)
    if cls is None:
        raise ValueError(f"unknown agent {name!r}; agents: {', '.join(AGENTS)}")
    return cls(seed)


__all__ = ["AGENTS", "Agent", "ExpertAgent", "NoopAgent", "RandomAgent", "make_agent"]
