"""In-process random-agent steps/s with every event stored, for durability "episode" and "step".

Usage: python bench/env_steps.py [--seconds S] [--repeat N] [--agent random]. Each durability is
measured N times for S seconds (alternating); figures are medians. The clock stops when the last
episode has ended and all its events are committed (before the store is closed). Last line: the
episode-durability figure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import fresh_sqlite_url, spread  # noqa: E402

import domain  # noqa: E402
from companyos.agents import make_agent  # noqa: E402
from companyos.env import CompanyEnv  # noqa: E402


def steps_per_second(durability: str, agent_name: str, seconds: float, chaos: str) -> tuple[float, int]:
    env = CompanyEnv(fresh_sqlite_url(), durability=durability, agent=agent_name)
    families = list(domain.TASK_FAMILIES)
    steps = episodes = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        agent = make_agent(agent_name, episodes)
        obs, _ = env.reset(seed=episodes, options={"task": families[episodes % len(families)],
                                                    "chaos": chaos})
        agent.reset(obs)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(agent.act(obs))
            steps += 1
            done = terminated or truncated
        episodes += 1
    # Every episode ended, so every event is committed (each step's, or each episode's at its
    # end). Closing the store (SQLite checkpoints its WAL then) is a one-off cost per store, not
    # per step: left out, so the figure does not depend on how long the run lasted.
    elapsed = time.perf_counter() - start
    env.close()
    return steps / elapsed, episodes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--agent", default="random")
    parser.add_argument("--chaos", default="medium")
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"step": [], "episode": []}
    for _ in range(max(1, args.repeat)):  # alternate, so a slow minute hits both alike
        for durability, rates in figures.items():
            rates.append(steps_per_second(durability, args.agent, args.seconds, args.chaos)[0])
    for durability, rates in figures.items():
        print(f"durability={durability} agent={args.agent} chaos={args.chaos} "
              f"steps_per_s={statistics.median(rates):.0f} (median; {spread(rates)})")
    print(f"steps_per_s={statistics.median(figures['episode']):.0f}")


if __name__ == "__main__":
    main()
