"""The security suite: each attack the runtime refuses, sent to the real gateway, broker and database
(docs/security.md). Its tests take the fixtures every tier over the real services takes (tests/conftest.py,
tests/fixtures.py) and the helpers of tests/integration; after each, every run's stored history folds into
its stored snapshot, as after every integration test."""

from tests.projections import snapshots_are_projections_of_their_events

__all__ = ["snapshots_are_projections_of_their_events"]  # autouse: pytest finds it here
