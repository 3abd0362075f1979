"""An exclusive `flock` that a caller can stop waiting for.

Linux has no timed `flock`, and Python retries a blocked one after a signal on any thread but
the main one. Without a limit, a writer process stopped while it holds the SQLite store's writer
lock (Ctrl-Z, SIGSTOP, a debugger) made every other writer wait for ever, where a plain SQLite
lock gives "database is locked" after the busy timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref


class TimedFlock:
    """The exclusive flock of one open file description: taken at once when it is free, else by
    a helper thread blocked in `flock` while the caller waits on a condition with a timeout.

    An flock belongs to the open file description, not to a thread. While the helper's request
    is pending, no one else in the process may try the lock on that description: a grant would
    then be a no-op conversion of a lock the caller already holds, and the helper's unlock of an
    abandoned wait would drop it. So a caller who finds a request pending adopts it, and the
    helper unlocks a grant only when no caller waits for it.
    """

    def __init__(self, fd: int) -> None:
        """Takes over `fd`: `close` closes it, and so does collecting a lock never closed (a store,
        CompanyEnv or Gym environment dropped without `close()` left one descriptor open each)."""
        self._fd = fd
        self._finalizer = weakref.finalize(self, _close_quietly, fd)
        self._finalizer.atexit = False  # the process's descriptors close with it anyway
        self._state = threading.Condition(threading.Lock())
        self._pending = False  # the helper is in (or about to enter) a blocking flock, or holds a grant
        self._waiting = False  # a caller waits for the helper's grant
        self._granted = False
        self._failure: OSError | None = None  # what the helper's flock raised instead
        self._closed = False
        self._requests = threading.Semaphore(0)
        self._helper: threading.Thread | None = None
        self._helper_fd: int | None = None  # the helper's dup, while it is open

    def acquire(self, wait: bool, timeout: float) -> bool:
        """Take the lock; False if it is held elsewhere and `wait` is False, or after `timeout`
        seconds of waiting. The caller serializes its own acquires (one holder per process)."""
        try:
            # Without the condition's lock while nothing is pending (every uncontended append
            # comes here): only this caller sets `_pending`, and the helper only clears it, so a
            # False read is still true, and no flock of the helper's can be under way.
            if not self._pending:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    if not wait:
                        return False
            elif not wait:
                return False
            with self._state:
                if not self._pending:  # else the request an earlier caller gave up is adopted
                    # pending only once the helper has the request: if it cannot start (EMFILE
                    # for its dup, no thread) every later wait would adopt a request no one serves
                    self._start_helper()
                    self._requests.release()
                    self._pending = True  # the helper reads it under this lock, after we let go
                self._waiting = True
                try:
                    self._state.wait_for(lambda: self._granted or self._failure, timeout)
                finally:
                    granted, failure = self._granted, self._failure
                    self._waiting = self._granted = False
                    self._failure = None
                if failure is not None:
                    raise failure
                return granted
        except BaseException:
            # A Ctrl-C (KeyboardInterrupt) is raised as the flock returns, or as the helper's
            # grant ends the wait: no one would use or let go of the lock taken. With no request
            # pending nothing else in the process holds it (the caller serializes acquires), so
            # unlocking is right whether this call took it or not; a pending request's grant
            # is the helper's to let go, since no one waits for it now.
            with self._state:
                if not self._pending:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
            raise

    def release(self) -> None:
        """Let the lock go (the caller holds it: no request is pending)."""
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the descriptor, and stop the helper once it is idle (a request it still has
        pending keeps the description, and the lock, until its grant is let go)."""
        with self._state:
            self._closed = True
        self._requests.release()
        self._finalizer.detach()  # never a second close: the number may belong to another file then
        os.close(self._fd)

    def close_inherited(self) -> None:
        """In a forked child: close the descriptors inherited from the parent, else a parent that
        dies holding the lock leaves it held until its children exit. Without the condition's
        lock, which a thread of the parent may have held at the fork; a descriptor the parent
        was closing at that moment is left open rather than risk closing another one."""
        self._finalizer.detach()
        for fd in (None if self._closed else self._fd, self._helper_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _start_helper(self) -> None:
        if self._helper is None:
            # its own descriptor of the same description: the caller may close theirs while the
            # helper still waits, and a reused descriptor number must not be unlocked by mistake
            fd = os.dup(self._fd)
            helper = threading.Thread(target=self._serve, args=(fd,), name="companyos-writer-lock",
                                      daemon=True)
            try:
                helper.start()
            except Exception:  # it did not start ("can't start new thread"); not a Ctrl-C in
                os.close(fd)  # start(), which can come once it runs with `fd`
                raise
            self._helper = helper  # only a started one: the next request tries again
            self._helper_fd = fd

    def _serve(self, fd: int) -> None:
        try:
            while True:
                self._requests.acquire()
                with self._state:
                    if not self._pending:  # woken by close()
                        if self._closed:
                            return
                        continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # blocks, without the GIL
                except OSError as exc:  # not EINTR: Python retries that itself
                    with self._state:
                        self._pending = False
                        self._failure = exc if self._waiting else None
                        self._state.notify()
                    continue
                with self._state:
                    if self._waiting:
                        self._granted = True
                        self._state.notify()
                    else:  # the caller gave up: let the lock go to whoever asks next
                        fcntl.flock(fd, fcntl.LOCK_UN)
                    # only now, after any unlock: `acquire` reads it without this lock, and a
                    # direct try of its own while this grant stood would be dropped with it
                    self._pending = False
        finally:
            self._helper_fd = None  # first: a child forked in between must not close a reused number
            os.close(fd)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
