"""Every table definition the migrations must produce: the store's and the read models'."""

from __future__ import annotations

import importlib

import sqlalchemy as sa


def _collect() -> list[sa.MetaData]:
    found = []
    for module in ("eventstore.schema", "projections.schema"):
        try:
            found.append(importlib.import_module(module).metadata)
        except ModuleNotFoundError:
            continue
    return found


target_metadata = _collect()
