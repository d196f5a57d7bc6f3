"""timer: ``python -m longrun.services.timer`` runs the timer service."""

from __future__ import annotations

from longrun.services.timer.main import main

main()
