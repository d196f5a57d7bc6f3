"""After every integration test: each run's stored history folds into its stored snapshot."""

from tests.projections import snapshots_are_projections_of_their_events

__all__ = ["snapshots_are_projections_of_their_events"]  # autouse: pytest finds it here
