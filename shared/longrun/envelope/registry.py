"""Bytes -> envelopes by (type, schema_version), and back: defined in ``longrun_client.registry``
(the public contract) and re-exported here for the runtime.

``make`` gives an envelope made inside a span that span's traceparent, through the same global
propagator ``longrun.otel`` uses, so what a service makes carries the trace it continues.
"""

from __future__ import annotations

from longrun_client.registry import ENVELOPES, LATEST, PAYLOADS, decode, encode, known_versions, make, traceparent

__all__ = ["ENVELOPES", "LATEST", "PAYLOADS", "decode", "encode", "known_versions", "make", "traceparent"]
