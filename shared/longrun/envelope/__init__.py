"""Versioned envelopes: the public bus contract."""

from __future__ import annotations

from longrun.envelope.model import DataClass, Envelope
from longrun.envelope.registry import ENVELOPES, LATEST, PAYLOADS, decode, encode, make

__all__ = ["ENVELOPES", "LATEST", "PAYLOADS", "DataClass", "Envelope", "decode", "encode", "make"]
