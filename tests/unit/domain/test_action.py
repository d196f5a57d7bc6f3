"""Action identity and recovery: request hashes, idempotency keys, what to do after a crash."""

from __future__ import annotations

from hypothesis import given, settings

from longrun.domain import EffectKind, FrozenMap, RecoveryPolicy, idempotency_key, recovery_policy, request_hash

from .support import json_objects


def test_recovery_after_a_crash_depends_on_the_effect_kind() -> None:
    assert recovery_policy(EffectKind.PURE) is RecoveryPolicy.RERUN
    assert recovery_policy(EffectKind.IDEMPOTENT_WRITE) is RecoveryPolicy.RERUN
    assert recovery_policy(EffectKind.READ) is RecoveryPolicy.RERUN_AND_RECORD_VERSION
    assert recovery_policy(EffectKind.NON_IDEMPOTENT_WRITE) is RecoveryPolicy.RECONCILE


@settings(max_examples=100, deadline=None, database=None)
@given(args=json_objects)
def test_a_request_hash_ignores_key_order_and_container_kind(args: dict[str, object]) -> None:
    reordered = FrozenMap(dict(reversed(list(args.items()))))
    assert request_hash("create_pr", "1", args=args) == request_hash("create_pr", "1", args=reordered)


def test_a_request_hash_changes_with_tool_version_or_args() -> None:
    base = request_hash("create_pr", "1", args={"branch": "a"})
    assert len(base) == 64
    assert base != request_hash("create_pr", "2", args={"branch": "a"})
    assert base != request_hash("create_pr", "1", args={"branch": "b"})
    assert base != request_hash("merge_pr", "1", args={"branch": "a"})


def test_an_idempotency_key_is_deterministic_opaque_and_unambiguous() -> None:
    key = idempotency_key("run-7", "ci", attempt_scope=1)
    assert key == idempotency_key("run-7", "ci", attempt_scope="1")
    assert key.startswith("lr-") and len(key) == 43
    assert key != idempotency_key("run-7", "ci", attempt_scope=2)
    assert idempotency_key("a:b", "c", attempt_scope=1) != idempotency_key("a", "b:c", attempt_scope=1)
