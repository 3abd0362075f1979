"""The lower bounds pyproject.toml promises are the versions constraints/lowest.txt installs."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement  # pytest's own dependency
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def _floors_promised() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for line in project["dependencies"]:
        requirement = Requirement(line)
        bounds = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        assert len(bounds) == 1, f"{line!r} has no single lower bound (`>=`)"
        floors[canonicalize_name(requirement.name)] = bounds[0]
    return floors


def _floors_pinned() -> dict[str, str]:
    pinned = {}
    for line in (ROOT / "constraints" / "lowest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            pins = [spec.version for spec in requirement.specifier if spec.operator == "=="]
            assert len(pins) == 1, f"{line!r} in constraints/lowest.txt is not name==version"
            pinned[canonicalize_name(requirement.name)] = pins[0]
    return pinned


def test_every_runtime_dependency_has_its_lower_bound_in_the_lowest_constraints():
    """A bound raised in one file and not the other would claim versions no one ran the suite at."""
    assert _floors_pinned() == _floors_promised()
