"""reconciler: ``python -m services.reconciler`` runs the reconciler service."""

from __future__ import annotations

from services.reconciler.main import main

main()
