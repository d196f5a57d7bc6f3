"""The timer service's use case: what a due timer does to its run, through the domain (``firing``).
Its service claims the due timers and writes what they do (``services/timer``)."""
