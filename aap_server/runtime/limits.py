"""Bounded consumption per principal (OWASP LLM10): request rate and concurrent turns.

Counters live in memory, one small entry per principal (principals are the configured API
keys, or the one local principal of an open server), so a check is O(1). Sessions and stored
bytes are counted by the store, in the same transaction as the writes (`StoreLimits`).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable

from aap_server.runtime.errors import AapError


class RateLimitedError(AapError):
    """The principal sends requests faster than its rate allows (429, `Retry-After`)."""

    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_seconds: int, details: object = None) -> None:
        super().__init__(message, details=details)
        self.retry_after_seconds = retry_after_seconds


class TooManyTurnsError(RateLimitedError):
    """The principal already runs as many turns as it may at once (429, `Retry-After`)."""

    code = "too_many_turns"


class TooManyAosRequestsError(RateLimitedError):
    """The key already has `max_concurrent_aos_requests` POST /aos requests being answered."""

    code = "too_many_aos_requests"


class TooManyJsonValuesError(AapError):
    """A request body holds more than `max_json_values_per_request` JSON values: refused
    before it is decoded (413)."""

    code = "too_many_json_values"


class _Bucket:
    """A token bucket: `burst` tokens, refilled at `rate` a second."""

    __slots__ = ("tokens", "updated")

    def __init__(self, tokens: float, updated: float) -> None:
        self.tokens = tokens
        self.updated = updated


class PrincipalLimits:
    """`requests_per_second` (bursts up to `burst`) and `max_concurrent_turns` per principal;
    0 turns a limit off."""

    def __init__(
        self,
        *,
        requests_per_second: float = 0,
        burst: int = 1,
        max_concurrent_turns: int = 0,
        max_concurrent_aos_requests: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.requests_per_second = requests_per_second
        self.burst = max(burst, 1)
        self.max_concurrent_turns = max_concurrent_turns
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._turns: dict[str, int] = {}
        self.max_concurrent_aos_requests = max_concurrent_aos_requests
        self._aos: dict[str, int] = {}

    def admit_request(self, owner: str) -> None:
        """Take one token of `owner`'s bucket, or raise RateLimitedError."""
        rate = self.requests_per_second
        if not rate:
            return
        now = self.clock()
        bucket = self._buckets.get(owner)
        if bucket is None:
            bucket = self._buckets[owner] = _Bucket(float(self.burst), now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return
        wait = (1 - bucket.tokens) / rate
        raise RateLimitedError(
            f"too many requests: at most {rate:g} a second (bursts of {self.burst}) per API "
            "key; retry after the time in Retry-After",
            retry_after_seconds=max(1, math.ceil(wait)),
            details={"requestsPerSecond": rate, "burst": self.burst},
        )

    def start_turn(self, owner: str) -> None:
        """Count a turn of `owner` as running, or raise TooManyTurnsError."""
        running = self._turns.get(owner, 0)
        if self.max_concurrent_turns and running >= self.max_concurrent_turns:
            raise TooManyTurnsError(
                f"too many turns at once: at most {self.max_concurrent_turns} per API key; "
                "retry when one of them has ended",
                retry_after_seconds=1,
                details={"maxConcurrentTurns": self.max_concurrent_turns},
            )
        self._turns[owner] = running + 1

    def end_turn(self, owner: str) -> None:
        _release(self._turns, owner)

    def running_turns(self, owner: str) -> int:
        return self._turns.get(owner, 0)

    def start_aos_request(self, owner: str) -> None:
        """Count a POST /aos request of `owner` as being answered, or raise
        TooManyAosRequestsError (one key's checks cannot fill the guardian's workers)."""
        running = self._aos.get(owner, 0)
        limit = self.max_concurrent_aos_requests
        if limit and running >= limit:
            raise TooManyAosRequestsError(
                f"too many POST /aos requests at once: at most {limit} per API key; retry "
                "when one of them has been answered",
                retry_after_seconds=1,
                details={"maxConcurrentAosRequests": limit},
            )
        self._aos[owner] = running + 1

    def end_aos_request(self, owner: str) -> None:
        _release(self._aos, owner)


def _release(running: dict[str, int], owner: str) -> None:
    """One of `owner`'s running requests ended (no entry kept for an owner with none)."""
    left = running.get(owner, 0) - 1
    if left > 0:
        running[owner] = left
    else:
        running.pop(owner, None)


# Bytes of a body scanned per event-loop pass while its JSON values are counted (a few C
# passes over them: well under a millisecond).
BYTES_PER_SLICE = 128 * 1024
_SEPARATORS = (b",", b"[", b"{", b":")
_STRING = re.compile(rb'"[^"]*+"')  # once escaped quotes are out of the text


def _separators(text: bytes, start: int = 0, end: int | None = None) -> int:
    return sum(text.count(separator, start, end) for separator in _SEPARATORS)


async def json_values_within(body: bytes, limit: int) -> bool:
    """Whether the JSON `body` holds at most `limit` values, told without decoding it.

    Decoding is one C call that holds the event loop ~0.3 µs a value, so a 10 MB body of
    `[{},{},…]` would hold it for seconds. Values are counted by what comes before each: a
    `[`, `{`, `,` or `:` outside strings (an empty container counts one too many). The body
    is scanned `BYTES_PER_SLICE` at a time, with a yield to the loop between slices (a string
    may run on from one slice into the next); it stops once past `limit`. Invalid JSON is
    counted as far as a decoder would get, or more."""
    found = 0
    for start in range(0, len(body), BYTES_PER_SLICE):
        if start:
            await asyncio.sleep(0)
        found += _separators(body, start, start + BYTES_PER_SLICE)
    if found < limit:
        return True  # the usual case: even counted inside strings, there are few enough
    values, start, in_string = 1, 0, False
    while start < len(body):
        await asyncio.sleep(0)
        end = start + BYTES_PER_SLICE
        chunk = body[start:end]
        if end < len(body) and (len(chunk) - len(chunk.rstrip(b"\\"))) % 2:
            # Its last `\` escapes what the next slice starts with: it goes with that one.
            chunk, end = chunk[:-1], end - 1
        start = end
        # Escaped backslashes, then escaped quotes, out: every `"` left opens or closes a string.
        text = chunk.replace(b"\\\\", b"").replace(b'\\"', b"")
        if in_string:  # a string runs on from the slice before
            closing = text.find(b'"')
            if closing < 0:
                continue
            text, in_string = text[closing + 1 :], False
        if text.count(b'"') % 2:  # the last string runs on into the next slice
            text, in_string = text[: text.rfind(b'"')], True
        values += _separators(_STRING.sub(b"", text))
        if values > limit:
            return False
    return True


async def check_json_values(body: bytes, limit: int) -> None:
    """Raise `TooManyJsonValuesError` if the JSON `body` holds more than `limit` values
    (`json_values_within`): before a request body is decoded."""
    if not await json_values_within(body, limit):
        raise TooManyJsonValuesError(
            f"body: holds more than {limit} JSON values (max_json_values_per_request); "
            "it was not decoded",
            details={"limit": limit, "setting": "max_json_values_per_request"},
        )
