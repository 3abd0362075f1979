"""The lower bounds pyproject.toml promises are the versions constraints/lowest.txt installs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_BOUND = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?>=([0-9][0-9.]*)")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _floors_promised() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for requirement in project["dependencies"]:
        bound = _BOUND.match(requirement)
        assert bound, f"{requirement!r} has no lower bound (a `>=` first)"
        floors[_canonical(bound[1])] = bound[2]
    return floors


def _floors_pinned() -> dict[str, str]:
    pinned = {}
    for line in (ROOT / "constraints" / "lowest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{line!r} in constraints/lowest.txt is not name==version"
            pinned[_canonical(name)] = version
    return pinned


def test_every_runtime_dependency_has_its_lower_bound_in_the_lowest_constraints():
    """A bound raised in one file and not the other would claim versions no one ran the suite at."""
    assert _floors_pinned() == _floors_promised()
