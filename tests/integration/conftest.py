"""After every integration test: each run's stored history folds into its stored snapshot. The
environments installed as the image installs them, for the tests run from outside the checkout."""

from tests.integration.image import fresh_database, image
from tests.projections import snapshots_are_projections_of_their_events

__all__ = ["fresh_database", "image", "snapshots_are_projections_of_their_events"]  # pytest finds them here
