"""`POST /aos` callers' guardian memory, kept in the store so that a verdict does not depend
on which replica answered, or on a restart in between (DESIGN; issues 7 and 10).

A session's stored memory is a snapshot and the change records after it, each stored at the
next version (see `CallerMemory`). Each check of a caller's session runs as: read what the
store holds after the version this process last read or saved (one indexed row and the
records newer than that: usually none), hand them to the guardian (in the caller's
`CheckScope`), check, and if the guardian learned something, store what it learned (a change
record, or now and then everything as a new snapshot) naming the version read. So a check
costs what it reads and adds, not the session's whole memory. A save that finds a newer
version writes nothing, and the step is checked again from the newer memory, after a short
jittered pause, at most `MEMORY_ATTEMPTS` times. That is rare: a check holds its session
(`SessionStore.hold_caller_memory`: in this process, and across the processes sharing the
store) from its read to its save, so two checks of one session never overlap, whichever
worker or replica runs them; waiting for it is bounded by the guardian's timeout. MCP and
A2A steps name no session: all those of a caller are one session, so they are checked one at
a time. Whatever goes wrong with the store (unreachable, held too long, still conflicting) is
a `deny` (fail closed), as is memory the guardian cannot read, and a session pushed out of
the caller's byte cap while tainted comes back tainted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import OrderedDict

from aap_server.aos import AosRequest, AosSuccessResult
from aap_server.guardian import FailClosed, Guardian
from aap_server.guardian.memory import SessionFacts, exported_tainted
from aap_server.store import CallerMemory, SessionStore
from aap_server.store.memory_lock import jittered

logger = logging.getLogger("aap_server.api.aos")

MEMORY_ATTEMPTS = 3
"""Checks of one step whose memory another replica changed meanwhile, before a `deny`."""
RETRY_PAUSE = 0.002
"""Seconds before checking such a step again (jittered, doubling per attempt)."""

_FRESH = SessionFacts().encode_whole()
_FORGOTTEN = SessionFacts.of_forgotten().encode_whole()


# The stored version this process's guardian last read or saved of a (caller, session), for
# the sessions it checked last: a check of one of them reads only the records stored after
# it. Kept per guardian (it is what that guardian holds); one forgotten costs its next check
# a read of the whole memory, nothing else.
MAX_HELD_VERSIONS = 100_000
_HELD: weakref.WeakKeyDictionary[Guardian, OrderedDict[tuple[str, str], int]] = (
    weakref.WeakKeyDictionary()
)


def _held_versions(guardian: FailClosed) -> OrderedDict[tuple[str, str], int]:
    held = _HELD.get(guardian.guardian)
    if held is None:
        held = _HELD[guardian.guardian] = OrderedDict()
    return held


def _hold(held: OrderedDict[tuple[str, str], int], key: tuple[str, str], version: int) -> None:
    held[key] = version
    held.move_to_end(key)
    if len(held) > MAX_HELD_VERSIONS:
        held.popitem(last=False)


def _take_in(guardian: FailClosed, session_id: str, stored: CallerMemory) -> bool:
    """Bring the guardian's memory of the session up to what is stored; False when it did
    not hold what the records read follow (read the whole memory then)."""
    if stored.after is not None:
        return guardian.extend_session(session_id, stored.records)
    if stored.memory is not None:
        guardian.import_session(session_id, [stored.memory, *stored.records])
        return True
    guardian.import_session(session_id, [_FORGOTTEN if stored.forgotten else _FRESH])
    guardian.memory_not_stored(session_id)  # nothing stored: what it learns is saved whole
    return True


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
    async with contextlib.AsyncExitStack() as held:
        try:
            await held.enter_async_context(
                store.hold_caller_memory(caller, session_id, guardian.timeout_seconds)
            )
        except TimeoutError:
            return _memory_unavailable("another check of this session held it too long")
        except Exception:
            logger.exception("holding the guardian memory of %s failed", caller)
            return _memory_unavailable("it could not be held")
        return await _check_held(guardian, store, caller, session_id, request)


async def _check_held(
    guardian: FailClosed, store: SessionStore, caller: str, session_id: str, request: AosRequest
) -> AosSuccessResult:
    key = (caller, session_id)
    held = _held_versions(guardian)
    for attempt in range(MEMORY_ATTEMPTS):
        if attempt:  # whoever changed it meanwhile (not holding the session) finishes first
            await asyncio.sleep(jittered(RETRY_PAUSE * 2 ** (attempt - 1)))
        try:
            stored = await store.load_caller_memory(caller, session_id, held.get(key))
            if not _take_in(guardian, session_id, stored):
                stored = await store.load_caller_memory(caller, session_id)
                _take_in(guardian, session_id, stored)
        except Exception:
            held.pop(key, None)
            logger.exception("reading the guardian memory of %s failed", caller)
            return _memory_unavailable("the database could not be read")
        if stored.version and not stored.forgotten:
            _hold(held, key, stored.version)
        else:
            held.pop(key, None)
        verdict = await guardian.check(request)
        exported = guardian.export_session(session_id)
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
                whole=exported.whole,
            )
        except Exception:
            logger.exception("saving the guardian memory of %s failed", caller)
            saved = None
        if saved:
            _hold(held, key, stored.version + 1)
            return verdict
        # Not stored: the guardian's memory of the session is not what the store holds.
        held.pop(key, None)
        guardian.memory_not_stored(session_id)
        if saved is None:
            return _memory_unavailable("the database could not be written")
    return _memory_unavailable("it kept changing under this check")
