"""Use cases: the imperative shell around the pure domain (admit, advance, fire timers, reconcile)."""
