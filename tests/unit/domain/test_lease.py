"""Leases and fencing: expiry allows takeover, the token fences out stale writers."""

from __future__ import annotations

import pytest

from longrun.domain import Lease, can_take, is_stale, release, renew, takeover
from longrun.domain.lease import LEASE_EXPIRED, MEMBER_LAPSED, recovered_by, recovery_cause


def test_a_never_leased_run_can_be_taken_and_gets_token_one() -> None:
    assert can_take(None, now=0.0)
    assert takeover(None, "w1", now=100.0, ttl=30.0) == Lease("w1", 130.0, 1)


def test_a_live_lease_blocks_takeover_until_it_expires() -> None:
    lease = Lease("w1", until=130.0, fencing_token=4)
    assert not can_take(lease, 129.9)
    with pytest.raises(ValueError, match="held by w1"):
        takeover(lease, "w2", now=129.9, ttl=30.0)
    assert can_take(lease, 130.0)
    assert takeover(lease, "w2", now=130.0, ttl=30.0) == Lease("w2", 160.0, 5)


def test_every_takeover_increments_the_token_even_by_the_same_owner() -> None:
    lease = takeover(None, "w1", now=0.0, ttl=10.0)
    again = takeover(lease, "w1", now=10.0, ttl=10.0)
    assert again.fencing_token == lease.fencing_token + 1


def test_a_stale_worker_is_fenced_out_whatever_its_clock_says() -> None:
    # Given w1's lease expired and w2 took over
    old = Lease("w1", until=10.0, fencing_token=1)
    new = takeover(old, "w2", now=11.0, ttl=10.0)
    # When w1 (whose clock still says its lease is live) writes with its old token, Then it is stale
    assert is_stale(old.fencing_token, new.fencing_token)
    assert not is_stale(new.fencing_token, new.fencing_token)
    assert is_stale(new.fencing_token + 1, new.fencing_token)


def test_renewal_extends_a_live_lease_and_keeps_the_token() -> None:
    lease = Lease("w1", until=30.0, fencing_token=3)
    assert renew(lease, "w1", now=20.0, ttl=30.0) == Lease("w1", 50.0, 3)
    assert renew(lease, "w1", now=20.0, ttl=1.0).until == 30.0
    with pytest.raises(ValueError, match="does not hold"):
        renew(lease, "w2", now=20.0, ttl=30.0)
    with pytest.raises(ValueError, match="does not hold"):
        renew(lease, "w1", now=30.0, ttl=30.0)
    with pytest.raises(ValueError, match="ttl"):
        renew(lease, "w1", now=20.0, ttl=0.0)


def test_a_released_lease_can_be_taken_and_tokens_never_go_back() -> None:
    lease = Lease("w1", until=30.0, fencing_token=3)
    released = release(lease, now=12.0)
    assert can_take(released, 12.0)
    assert takeover(released, "w2", now=12.0, ttl=5.0).fencing_token == 4


def test_a_recovery_names_the_lost_lease_and_is_told_from_any_other_cause() -> None:
    # Given the causes a run's recovery names, and causes that are not recoveries
    expired = recovery_cause(LEASE_EXPIRED, "worker-1", 4)
    lapsed = recovery_cause(MEMBER_LAPSED, "worker-2", 7)
    # Then each names the lost lease, and is told by its prefix alone
    assert (expired, lapsed) == ("lease-expired:worker-1:4", "member-lapsed:worker-2:7")
    assert [recovered_by(c) for c in (expired, lapsed)] == [LEASE_EXPIRED, MEMBER_LAPSED]
    assert [recovered_by(c) for c in (None, "evt-5b1e", "adopted:worker-3:2", "lease-expired")] == [None] * 4
