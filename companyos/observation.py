"""Observations the agent sees: plain JSON-able dicts whose LLM text rendering is built only on demand."""

from __future__ import annotations

from typing import Any

from domain.render import render_text


class Observation(dict):
    """A dict observation; `obs["text"]` (or `.text`) renders it for an LLM the first time it is
    asked. The rendering is kept beside the dict, not in it: stored as a key, reading it once
    changed `obs == other`, `json.dumps(obs)` and `obs.keys()`, so trajectories recorded with
    and without reading the text compared unequal."""

    __slots__ = ("_text",)

    def __missing__(self, key: str) -> Any:
        if key != "text":
            raise KeyError(key)
        try:
            return self._text
        except AttributeError:
            self._text = render_text({k: v for k, v in self.items() if k != "tools"})
            return self._text

    @property
    def text(self) -> str:
        return self["text"]

    def with_text(self) -> dict[str, Any]:
        """A plain dict that includes the text rendering, for wire formats."""
        return {**self, "text": self["text"]}
