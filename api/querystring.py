"""Query strings read one value per name, the same way on every route."""

from __future__ import annotations

from collections.abc import Iterable


class RepeatedParameter(ValueError):
    """A name appeared twice in a query string: which value was meant cannot be known."""

    def __init__(self, name: str) -> None:
        super().__init__(f"parameter {name!r} is given more than once")


def single_valued(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The query's parameters as a dict, refusing a repeated name rather than keeping the last."""
    params: dict[str, str] = {}
    for key, value in pairs:
        if key in params:
            raise RepeatedParameter(key)
        params[key] = value
    return params
