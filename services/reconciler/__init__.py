"""reconciler: settles actions in doubt, re-wakes runs whose lease expired, flags silent runs, keeps dead letters."""

from __future__ import annotations
