"""Observations the agent sees: plain JSON-able dicts whose LLM text rendering is built only on demand."""

from __future__ import annotations

from typing import Any

from domain.render import render_text


class Observation(dict):
    """A dict observation; `obs["text"]` (or `.text`) renders it for an LLM the first time it is asked."""

    __slots__ = ()

    def __missing__(self, key: str) -> Any:
        if key != "text":
            raise KeyError(key)
        text = render_text({k: v for k, v in self.items() if k != "tools"})
        self["text"] = text
        return text

    @property
    def text(self) -> str:
        return self["text"]

    def with_text(self) -> dict[str, Any]:
        """A plain dict that includes the text rendering, for wire formats."""
        self["text"]  # noqa: B018 - render once, cached in the dict
        return dict(self)
