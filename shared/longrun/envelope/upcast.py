"""Pure upcasters, payload dict of version n -> version n+1: defined in ``longrun_client.upcast``
(the public contract) and re-exported here for the runtime. Each has a golden test in
tests/unit/envelope."""

from __future__ import annotations

from longrun_client.upcast import (UPCASTERS, Upcaster, upcast, upcast_run_create_v1_v2, upcast_run_create_v2_v3,
                                   upcast_run_create_v3_v4, upcast_run_event_v1_v2, upcast_run_rejected_v1_v2,
                                   upcast_run_rejected_v2_v3)

__all__ = ["UPCASTERS", "Upcaster", "upcast", "upcast_run_create_v1_v2", "upcast_run_create_v2_v3",
           "upcast_run_create_v3_v4", "upcast_run_event_v1_v2", "upcast_run_rejected_v1_v2",
           "upcast_run_rejected_v2_v3"]
