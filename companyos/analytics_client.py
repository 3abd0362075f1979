"""RemoteAnalytics: a `companyos serve` server's named analytics questions, from Python.

`GET /analytics/{name}` answers 202 while the server's warehouse catches up with a large backlog
(minutes for tens of millions of events). A notebook wants rows, not a status code: this client
asks the server to wait (`Prefer: wait=N`), asks again after each `Retry-After`, and gives up
only after its own `timeout`, saying how far the sync got.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any
from urllib.parse import quote

from companyos.client import HttpWire, RemoteServerError, auth_headers, server_url

MAX_SERVER_WAIT_S = 600
"""The longest `Prefer: wait` the server honours; a longer timeout is spent over several requests."""
_SLACK_S = 30.0  # beyond the wait asked for: the query itself, and the network


class RemoteAnalytics:
    """Named analytics questions over HTTP: `queries()` lists them with their parameters,
    `query(name, **params)` answers one as a list of row objects, as
    `companyos analytics query NAME --format json` prints them.

    Errors as `RemoteCompanyEnv` raises them: an unknown query or a bad parameter is a
    `RemoteRequestError` (a ValueError), a busy or failing server a `RemoteServerError`, no answer a
    `RemoteConnectionError`; each has `status`, `code` and `detail`. A sync still running after
    `timeout` seconds is a `RemoteServerError` with code "syncing" and its progress in words.
    """

    def __init__(self, base_url: str, *, timeout: float = 600.0, api_key: str | None = None) -> None:
        self.base_url = server_url(base_url, timeout)
        self.timeout = timeout
        self._wire = HttpWire(self.base_url, timeout, auth_headers(api_key))

    def queries(self) -> list[dict[str, Any]]:
        """Every named question: its name, description and typed parameters."""
        return self._wire.call("GET", "/analytics")

    def query(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """The rows answering question `name` with `params` (booleans as true/false; a parameter
        given as None is left out, so it takes its default, as if it had not been given)."""
        path = "/analytics/" + quote(name, safe="")
        for key, value in params.items():  # a list went as its repr: a filter matching nothing
            if value is not None and not isinstance(value, str | numbers.Real):
                raise ValueError(f"parameter {key!r} must be text, a number or a boolean, not "
                                 f"{type(value).__name__}")
        sent = {k: str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in params.items() if v is not None}
        deadline = time.monotonic() + self.timeout
        while True:
            # whole seconds, rounded up: a timeout under a second asked for wait=0
            wait = max(0, min(math.ceil(deadline - time.monotonic()), MAX_SERVER_WAIT_S))
            response = self._wire.request("GET", path, params=sent, headers={"Prefer": f"wait={wait}"},
                                          timeout=wait + _SLACK_S)
            body = self._wire.json(response)
            if response.status_code != 202:
                return body
            left = deadline - time.monotonic()
            if left <= 0:
                said = body.get("detail") if isinstance(body, dict) else None
                raise RemoteServerError(202, "syncing", f"{said or 'the warehouse is syncing'} "
                                        f"(gave up after {self.timeout:g} s)", self.base_url + path)
            time.sleep(min(_seconds(response.headers.get("retry-after")), left))

    def close(self) -> None:
        self._wire.close()

    def __enter__(self) -> RemoteAnalytics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seconds(retry_after: str | None) -> float:
    """Retry-After as delta-seconds (the server sends no dates); 2 s when absent or unreadable."""
    return float(retry_after) if retry_after and retry_after.isascii() and retry_after.isdigit() else 2.0
