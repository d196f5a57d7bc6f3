"""The envelope every message on the bus travels in: defined in ``longrun_client.model``, the
public contract's own distribution, and re-exported here for the runtime."""

from __future__ import annotations

from longrun_client.model import TENANT_PATTERN, DataClass, Envelope, Strict, envelope_fields, new_event_id, utcnow

__all__ = ["TENANT_PATTERN", "DataClass", "Envelope", "Strict", "envelope_fields", "new_event_id", "utcnow"]
