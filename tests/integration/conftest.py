"""After every integration test: each run's stored history folds into its stored snapshot. The S3
server of the session is started by the first test that asks for it."""

from tests.integration.s3_server import s3_server
from tests.projections import snapshots_are_projections_of_their_events

__all__ = ["s3_server", "snapshots_are_projections_of_their_events"]  # pytest finds them here
