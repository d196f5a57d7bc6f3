"""worker: advances runs under a lease, calling models and tools through the action ledger."""
