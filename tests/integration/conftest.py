"""After every integration test: each run's stored history folds into its stored snapshot. The
environments installed as the image installs them, for the tests run from outside the checkout, and
the session's S3 server, started by the first test that asks for it."""

from tests.integration.image import fresh_database, image
from tests.integration.s3_server import s3_server
from tests.projections import snapshots_are_projections_of_their_events

__all__ = ["fresh_database", "image", "s3_server", "snapshots_are_projections_of_their_events"]  # pytest finds them
