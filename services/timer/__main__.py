"""timer: ``python -m services.timer`` runs the timer service."""

from __future__ import annotations

from services.timer.main import main

main()
