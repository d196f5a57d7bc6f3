"""Code-first run kinds: an async function with a typed input and output whose awaits are journaled in
the run's events and action ledger, replayed on every wake (``kind.workflow``)."""
