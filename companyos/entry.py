"""The `companyos` command's entry point, importing nothing heavy itself: Ctrl-C in the half
second the command's modules take to load printed a traceback of the import under way."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from companyos.cli import main as command

        command()
    except KeyboardInterrupt:  # before the command's own handlers were in place
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(130) from None
