"""The turn lease across replicas: one turn per session, whichever replica runs it.

The runtime's in-process `_active` map answers for this replica; the store's lease answers
for every replica sharing the database (PostgreSQL, or a SQLite file served by several
`serve --workers`; a no-op for a SQLite file one process owns). A held
lease is renewed every third of its time to live while the turn runs, so a turn may run
longer than the lease, and a replica that dies holding one frees the session once it lapses.
"""

from __future__ import annotations

import asyncio
import logging

from aap_server.runtime.limits import TooManyTurnsError
from aap_server.store import QuotaExceededError, SessionStore, TurnClaim

logger = logging.getLogger("aap_server.runtime")


class TurnLeases:
    def __init__(self, store: SessionStore, ttl_seconds: float, max_turns: int = 0) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds
        # A principal's turns at once across every replica (0: no limit); a store with no
        # shared leases (SQLite in one process) leaves it to the in-process count
        # (`PrincipalLimits`).
        self.max_turns = max_turns
        self._renewers: dict[str, asyncio.Task[None]] = {}  # turn id -> its renewing task

    async def take(self, session_id: str, turn_id: str, owner: str = "") -> str | None:
        """Claim the session for `turn_id` of `owner`: None when claimed (and kept renewed
        until `release`), otherwise the id of the turn that holds it on some replica.
        TooManyTurnsError when `owner` already runs `max_turns` turns on any replica."""
        return (await self.claim(session_id, turn_id, owner)).holder

    async def claim(
        self, session_id: str, turn_id: str, owner: str = "", *, check_quota: bool = False
    ) -> TurnClaim:
        """`take`, with what the store read in the same transaction (`SessionStore.claim_turn`:
        the session's version; with `check_quota`, QuotaExceededError "stored_bytes" when
        `owner` is at its quota, nothing claimed)."""
        try:
            claim = await self.store.claim_turn(
                session_id,
                turn_id,
                self.ttl_seconds,
                owner=owner,
                max_turns=self.max_turns if owner else 0,
                check_quota=check_quota,
            )
        except QuotaExceededError as error:
            if error.kind != "turns":
                raise
            raise TooManyTurnsError(
                f"too many turns at once: at most {error.limit} per API key across replicas; "
                "retry when one of them has ended",
                retry_after_seconds=1,
                details={"maxConcurrentTurns": error.limit},
            ) from error
        if claim.holder is None and claim.shared:
            self._renewers[turn_id] = asyncio.create_task(self._renew(session_id, turn_id))
        return claim

    async def _renew(self, session_id: str, turn_id: str) -> None:
        while True:
            await asyncio.sleep(self.ttl_seconds / 3)
            try:
                if not await self.store.renew_turn(session_id, turn_id, self.ttl_seconds):
                    logger.warning("turn %s lost its lease on %s", turn_id, session_id)
                    return
            except Exception as error:  # any store error: try again next time, never die
                logger.warning("turn %s could not renew its lease: %s", turn_id, error)

    async def release(self, session_id: str, turn_id: str) -> None:
        renewer = self._renewers.pop(turn_id, None)
        if renewer is None:
            return
        renewer.cancel()
        await asyncio.gather(renewer, return_exceptions=True)
        try:
            await self.store.release_turn(session_id, turn_id)
        except Exception as error:  # it lapses by itself
            logger.warning("turn %s could not release its lease: %s", turn_id, error)

    async def holder(self, session_id: str) -> str | None:
        return await self.store.turn_holder(session_id)
