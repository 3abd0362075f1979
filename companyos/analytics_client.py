"""RemoteAnalytics: a `companyos serve` server's named analytics questions, from Python.

`GET /analytics/{name}` answers 202 while the server's warehouse catches up with a large backlog
(minutes for tens of millions of events). A notebook wants rows, not a status code: this client
asks the server to wait (`Prefer: wait=N`), asks again after each `Retry-After`, and gives up
only after its own `timeout`, saying how far the sync got.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import orjson

from companyos.client import RemoteConnectionError, RemoteServerError, _refusal, _unreachable, _unreadable

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
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if urlsplit(base_url).scheme not in ("http", "https"):
            raise ValueError(f"base_url must be the server's http:// or https:// URL, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers)

    def queries(self) -> list[dict[str, Any]]:
        """Every named question: its name, description and typed parameters."""
        return self._get("/analytics", None, {}, self.timeout)[1]

    def query(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """The rows answering question `name` with `params` (booleans as true/false)."""
        path = "/analytics/" + quote(name, safe="")
        sent = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in params.items()}
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            wait = max(0, min(int(left), MAX_SERVER_WAIT_S))
            status, body, retry_after = self._get(path, sent, {"Prefer": f"wait={wait}"}, wait + _SLACK_S)
            if status != 202:
                return body
            left = deadline - time.monotonic()
            if left <= 0:
                said = body.get("detail") if isinstance(body, dict) else None
                raise RemoteServerError(202, "syncing", f"{said or 'the warehouse is syncing'} "
                                        f"(gave up after {self.timeout:g} s)", self.base_url + path)
            time.sleep(min(retry_after, left))

    def _get(self, path: str, params: dict | None, headers: dict[str, str],
             timeout: float) -> tuple[int, Any, float]:
        """(status, JSON body, Retry-After seconds) of a successful answer; refusals raised."""
        url = self.base_url + path
        try:
            response = self._client.get(path, params=params, headers=headers, timeout=timeout)
        except httpx.TimeoutException:
            raise RemoteConnectionError(None, "timeout", f"no answer from {url} within {timeout:g} s",
                                        url) from None
        except httpx.ConnectError as exc:
            raise _unreachable(self.base_url, exc) from None
        except httpx.TransportError as exc:
            raise RemoteConnectionError(None, "connection_lost", f"the connection to {url} was lost "
                                        f"before it answered ({exc})", url) from None
        if response.status_code >= 400:
            raise _refusal(response.status_code, response.content, url)
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise _unreadable(url, response.status_code, response.content) from None
        return response.status_code, body, _seconds(response.headers.get("retry-after"))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteAnalytics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seconds(retry_after: str | None) -> float:
    """Retry-After as delta-seconds (the server sends no dates); 2 s when absent or unreadable."""
    return float(retry_after) if retry_after and retry_after.isdigit() else 2.0
