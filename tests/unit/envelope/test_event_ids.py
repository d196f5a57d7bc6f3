"""Event ids are random version-4 UUIDs in their canonical text form."""

from __future__ import annotations

import uuid

from longrun.envelope.model import new_event_id


def test_event_ids_are_canonical_random_v4_uuids_and_do_not_repeat() -> None:
    ids = [new_event_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    for text in ids[:1000]:
        parsed = uuid.UUID(text)
        assert (str(parsed), parsed.version, parsed.variant) == (text, 4, uuid.RFC_4122)
    # every bit outside the version and variant fields varies
    seen = 0
    for text in ids:
        seen |= uuid.UUID(text).int
    assert seen == (1 << 128) - 1 & ~(0xF << 76) & ~(0x3 << 62) | (0x4 << 76) | (0x2 << 62)
