"""The per-principal token bucket refills at its rate and never beyond its burst."""

from __future__ import annotations

import pytest

from aap_server.runtime.limits import PrincipalLimits, RateLimitedError, TooManyTurnsError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_refills_at_the_rate_up_to_the_burst() -> None:
    clock = Clock()
    limits = PrincipalLimits(requests_per_second=2, burst=4, clock=clock)
    for _ in range(4):
        limits.admit_request("alice")
    with pytest.raises(RateLimitedError) as refused:
        limits.admit_request("alice")
    assert refused.value.retry_after_seconds == 1
    clock.now += 0.5  # one token back
    limits.admit_request("alice")
    with pytest.raises(RateLimitedError):
        limits.admit_request("alice")
    clock.now += 3600  # idle for long: still only `burst` tokens
    for _ in range(4):
        limits.admit_request("alice")
    with pytest.raises(RateLimitedError):
        limits.admit_request("alice")
    limits.admit_request("bob")  # a bucket per principal


def test_concurrent_turns_are_counted_per_principal_and_released() -> None:
    limits = PrincipalLimits(max_concurrent_turns=2)
    limits.start_turn("alice")
    limits.start_turn("alice")
    with pytest.raises(TooManyTurnsError):
        limits.start_turn("alice")
    limits.start_turn("bob")
    limits.end_turn("alice")
    limits.start_turn("alice")
    assert limits.running_turns("alice") == 2


def test_zero_means_no_limit() -> None:
    limits = PrincipalLimits()
    for _ in range(10_000):
        limits.admit_request("alice")
        limits.start_turn("alice")
