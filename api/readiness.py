"""The /ready probe: does the store's database answer, within a bound, without flooding the log.

A load balancer probes every few seconds. A database that hangs must make the probe a 503 in
seconds, not a request that hangs with it; probes during the hang share the one check under way
instead of piling up threads; the check runs on a daemon thread, so a hung one never holds up the
process's exit; and the log says when the server stops and starts being ready, not at every probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from api.sessions import log, outage_answer, outage_classes
from eventstore import EventStore

READY_TIMEOUT_S = 5.0
"""How long /ready waits for the store's database before it answers 503."""


class Readiness:
    def __init__(self, store: EventStore) -> None:
        self._store = store
        self._check: asyncio.Future[int] | None = None
        self._ready = True  # as last answered: the log says only when it changes

    async def position(self) -> int:
        """The store's last position; ApiError 503 `store_unavailable` while it does not answer."""
        try:
            position = await self._within_bound()
        except outage_classes() as exc:
            if self._ready:
                self._ready = False
                log.warning("not ready: the store's database failed (%s: %s)", type(exc).__name__,
                            exc)
            raise outage_answer(exc) from None
        if not self._ready:
            self._ready = True
            log.warning("ready again: the store's database answers")
        return position

    async def _within_bound(self) -> int:
        check, loop = self._check, asyncio.get_running_loop()
        if check is None or check.done() or check.get_loop() is not loop:
            check = self._check = self._on_a_daemon_thread(loop)
        try:
            return await asyncio.wait_for(asyncio.shield(check), READY_TIMEOUT_S)
        except TimeoutError:
            raise sa.exc.TimeoutError(f"the store's database did not answer within "
                                      f"{READY_TIMEOUT_S:g} s") from None

    def _on_a_daemon_thread(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[int]:
        future: asyncio.Future[int] = loop.create_future()
        future.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved

        def settle(outcome: Callable[[asyncio.Future], Any]) -> None:  # on the loop
            if not future.done():
                outcome(future)

        def deliver(outcome: Callable[[asyncio.Future], Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed while the check hung
                loop.call_soon_threadsafe(settle, outcome)

        def check() -> None:
            try:
                position = self._store.last_position()
            except BaseException as exc:  # noqa: BLE001 - handed to the probe that waits
                deliver(lambda f, failed=exc: f.set_exception(failed))
            else:
                deliver(lambda f: f.set_result(position))

        threading.Thread(target=check, name="companyos-ready", daemon=True).start()
        return future
