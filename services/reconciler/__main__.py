"""reconciler: ``python -m longrun.services.reconciler`` runs the reconciler service."""

from __future__ import annotations

from longrun.services.reconciler.main import main

main()
