"""`POST /aos` callers' guardian memory, kept in the store so that a verdict does not depend
on which replica answered, or on a restart in between (DESIGN; issue 10).

Each check of a caller's session runs as: read the session's stored memory (one indexed
row), hand it to the guardian (in the caller's `CheckScope`), check, and if the guardian
learned something, save it back naming the version read. A save that finds a newer version
(another replica checked a step of the same session meanwhile) writes nothing, and the step
is checked again from the newer memory, at most `MEMORY_ATTEMPTS` times; in this process a
session's checks run one at a time. Whatever goes wrong with the store (unreachable, still
conflicting) is a `deny` (fail closed), as is memory the guardian cannot read, and a
session pushed out of the caller's byte cap while tainted comes back tainted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aap_server.aos import AosRequest, AosSuccessResult
from aap_server.guardian import FailClosed
from aap_server.guardian.memory import SessionFacts, exported_tainted
from aap_server.store import SessionStore

logger = logging.getLogger("aap_server.api.aos")

MEMORY_ATTEMPTS = 3
"""Checks of one step whose memory another replica changed meanwhile, before a `deny`."""

_FRESH = SessionFacts().encode_whole()
_FORGOTTEN = SessionFacts.of_forgotten().encode_whole()


class _SessionLocks:
    """One lock per (caller, session) in use, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: tuple[str, str]) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


_LOCKS = _SessionLocks()


def _memory_unavailable(why: str) -> AosSuccessResult:
    return AosSuccessResult(
        decision="deny",
        message=f"the guardian's memory of this session is unavailable ({why}); try again",
        reason_code=["guardian.memory_unavailable"],
        data={"ruleId": "guardian.memory_unavailable"},
    )


async def check_with_stored_memory(
    guardian: FailClosed, store: SessionStore, caller: str, request: AosRequest
) -> AosSuccessResult:
    """The guardian's verdict on a caller's step, its memory of the step's session read from
    and saved to the store. Call inside the caller's `check_scope`."""
    context = getattr(request.params, "context", None)
    # MCP and A2A messages name no session: they share the caller's unnamed one.
    session_id = context.session.id if context is not None else ""
    async with _LOCKS.hold((caller, session_id)):
        for _ in range(MEMORY_ATTEMPTS):
            try:
                stored = await store.load_caller_memory(caller, session_id)
            except Exception:
                logger.exception("reading the guardian memory of %s failed", caller)
                return _memory_unavailable("the database could not be read")
            if stored.memory is not None:
                memory = stored.memory
            else:
                memory = _FORGOTTEN if stored.forgotten else _FRESH
            guardian.import_session(session_id, [memory])
            verdict = await guardian.check(request)
            exported = guardian.export_session(session_id)  # whole, in a caller's scope
            if exported is None:
                return verdict
            learned = exported.record
            try:
                saved = await store.save_caller_memory(
                    caller,
                    session_id,
                    learned,
                    tainted=exported_tainted(learned),
                    version=stored.version,
                )
            except Exception:
                logger.exception("saving the guardian memory of %s failed", caller)
                return _memory_unavailable("the database could not be written")
            if saved:
                return verdict
        return _memory_unavailable("it kept changing under this check")
