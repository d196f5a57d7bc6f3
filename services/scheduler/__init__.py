"""scheduler: creates runs from run.create and admits them to workers."""
