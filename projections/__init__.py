"""Read models folded from the event log: episode summaries and app views, with replay and checks."""

from __future__ import annotations

from projections.runner import PAGE, Projection, ProjectionRunner


def default_projections(on_error=None) -> list[Projection]:
    """Every read model the product keeps: `episodes` (summaries) and `views` (app views)."""
    from projections.episodes import EpisodesProjection
    from projections.views import ViewsProjection

    chosen: list[Projection] = [EpisodesProjection(), ViewsProjection()]
    for projection in chosen:
        projection.on_error = on_error
    return chosen


PROJECTION_NAMES = ("episodes", "views")

__all__ = ["PAGE", "PROJECTION_NAMES", "Projection", "ProjectionRunner", "default_projections"]
