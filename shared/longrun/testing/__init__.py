"""Public test kit: the invariant checker every fault scenario ends in."""
