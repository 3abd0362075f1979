"""The noop agent: every step it lists the tickets, a harmless read that changes nothing.

(A valid read rather than an invalid action, so its return measures the cost of doing
nothing, not of calling tools wrongly.)
"""

from __future__ import annotations


class NoopAgent:
    name = "noop"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def reset(self, observation: dict) -> None:
        pass

    def act(self, observation: dict) -> dict:
        return {"app": "ticketdesk", "method": "list_tickets", "params": {}}
