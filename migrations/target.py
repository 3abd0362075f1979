"""Every table definition the migrations must produce: the store's and the read models'."""

from __future__ import annotations

import eventstore.schema
import projections.schema

target_metadata = [eventstore.schema.metadata, projections.schema.metadata]
