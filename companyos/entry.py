"""The `companyos` command's entry point, importing nothing heavy itself: Ctrl-C in the half
second the command's modules take to load printed a traceback of the import under way."""

from __future__ import annotations

import sys


def redelivered(hook, delay_s: float = 0.05):  # type: ignore[no-untyped-def]
    """`sys.unraisablehook` that delivers a Ctrl-C again where Python could not raise it (one that
    lands in an import lock's callback is "Exception ignored", with a traceback, and the command
    went on as if never interrupted); every other unraisable error goes to `hook`."""
    import _thread
    import threading

    def on_unraisable(unraisable) -> None:  # type: ignore[no-untyped-def]
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            # a moment later, from another thread: raised from here, in the main thread, it
            # landed inside this hook and was "ignored" once more
            again = threading.Timer(delay_s, _thread.interrupt_main)
            again.daemon = True
            again.start()
            return
        hook(unraisable)

    return on_unraisable


def main() -> None:
    sys.unraisablehook = redelivered(sys.unraisablehook)
    try:
        from companyos.cli import main as command

        command()
    except KeyboardInterrupt:  # before the command's own handlers were in place
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(130) from None
