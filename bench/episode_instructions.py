"""CPU instructions per logged episode of `companyos run`, counted by valgrind (callgrind).

Usage: python bench/episode_instructions.py [--agent expert] [--episodes 200] [--top 25]

Why: this VM's speed drifts by up to 40% within an hour, so timing two versions of the code
cannot show a 5% change. Instruction counts can: they repeat to ~0.3%. The script runs the
episode loop of `companyos run` (one worker, durability "episode", a fresh SQLite store) under
callgrind twice, with a few warm-up episodes and with `--episodes` more, and reports the
difference per episode, so interpreter start, imports and migrations cancel out. `--top` also
lists the extension functions (SQLite, orjson, hashlib, ...) that account for the most
instructions per episode, inclusive; the interpreter's own functions are left out, since every
Python function runs inside them (use py-spy to see those).

Not counted: time in the kernel (SQLite's WAL writes), cache misses, waiting for the other
worker. It is a measure to compare versions of the code, not a rate. Needs valgrind
(`apt-get install valgrind`); about a minute for 200 episodes. Last line:
`instructions_per_episode=N`.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 50

_CHILD = """
import sys
sys.path.insert(0, {root!r})
from companyos.batch import RunPlan, run_range
from eventstore import EventStore
url = "sqlite:///" + sys.argv[1]
plan = RunPlan(db=url, agent=sys.argv[2], task="all", chaos="medium", episodes=10**9, seed=0)
with EventStore.open(url) as store:
    run_range(plan, 0, int(sys.argv[3]), store)
"""

_TOTAL = re.compile(r"Collected : (\d+)")
_LINE = re.compile(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*)")


def callgrind(agent: str, episodes: int, work: Path) -> tuple[int, Path]:
    """Total instructions of one child run of `episodes` episodes, and its callgrind file."""
    out = work / f"callgrind.{episodes}"
    script = work / "child.py"
    script.write_text(_CHILD.format(root=str(ROOT)))
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
         str(script), str(work / f"store-{episodes}.db"), agent, str(episodes)],
        capture_output=True, text=True)
    found = _TOTAL.search(done.stderr)
    if done.returncode != 0 or not found:
        sys.exit(f"valgrind failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1)), out


def inclusive(path: Path) -> dict[str, int]:
    """Inclusive instructions by C function outside the interpreter core (callgrind_annotate's
    table: extension modules and the libraries they call)."""
    shown = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
                           capture_output=True, text=True, check=True).stdout
    table: dict[str, int] = {}
    for line in shown.splitlines():
        match = _LINE.match(line)
        if match and _outside_interpreter(match.group(2)):
            name = re.sub(r"^.*/Python-[\d.]+/", "", match.group(2).split(" [")[0])
            table[name] = max(table.get(name, 0), int(match.group(1).replace(",", "")))
    return table


_CALL_BACK_INTO_PYTHON = ("main.c", "gcmodule.c", "_functoolsmodule.c")
"""Modules whose inclusive cost is mostly the Python code they call."""


def _outside_interpreter(entry: str) -> bool:
    """An extension module's function or a library's, not the interpreter's or libc's."""
    name, _, obj = entry.partition(" [")
    if name.startswith("???:0x") or any(f"Modules/{m}" in name for m in _CALL_BACK_INTO_PYTHON):
        return False
    if "Modules/_" in name:
        return True  # e.g. _sqlite, _blake2: built into libpython but an extension's work
    core = ("libpython", "/bin/python", "libc.so", "ld-linux")
    return bool(obj) and not any(part in obj for part in core)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", default="expert")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--top", type=int, default=0, help="list the N costliest C functions")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed: apt-get install valgrind")
    if args.episodes < 1:
        sys.exit("--episodes must be at least 1")
    with tempfile.TemporaryDirectory(prefix="companyos-ir-") as tmp:
        work = Path(tmp)
        base, base_file = callgrind(args.agent, WARM_UP, work)
        more, more_file = callgrind(args.agent, WARM_UP + args.episodes, work)
        per_episode = (more - base) / args.episodes
        if args.top:
            before, after = inclusive(base_file), inclusive(more_file)
            costs = {name: (after[name] - before.get(name, 0)) / args.episodes for name in after}
            print(f"instructions per episode, inclusive, top {args.top}:")
            for name, cost in sorted(costs.items(), key=lambda item: -item[1])[:args.top]:
                print(f"{cost:12,.0f} {cost / per_episode:6.1%}  {name[:100]}")
    print(f"agent={args.agent} episodes={args.episodes} warm_up={WARM_UP}")
    print(f"instructions_per_episode={per_episode:.0f}")


if __name__ == "__main__":
    main()
