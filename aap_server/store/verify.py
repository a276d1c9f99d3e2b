"""Checking every audit chain of a store: where, if anywhere, each one breaks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

from aap_server.store.audit import first_broken
from aap_server.store.base import AuditChain, SessionStore

CHAINS_PER_PAGE = 100
ENTRIES_PER_PAGE = 1000


class ChainReport(msgspec.Struct, frozen=True, kw_only=True):
    chain: str
    owner: str
    entries: int
    # The seq of the first entry whose hash or link does not hold, or of the first entry
    # missing from the chain's end; None: the chain holds.
    broken_at: int | None = None
    # Why it breaks there.
    problem: str | None = None


async def _chains(store: SessionStore) -> AsyncIterator[AuditChain]:
    after: str | None = None
    while page := await store.list_audit_chains(after, CHAINS_PER_PAGE):
        for chain in page:
            yield chain
        after = page[-1].chain


async def verify_chain(store: SessionStore, chain: AuditChain) -> ChainReport:
    """Walk the chain page by page from its first kept entry (memory bounded by a page), then
    check that it ends where the store recorded its newest entry."""
    prev_hash, expected_seq, count = chain.start_hash, chain.start_seq, 0
    after: str | None = None
    while True:
        page = await store.load_audit(chain.chain, after, ENTRIES_PER_PAGE)
        for index, entry in enumerate(page.records):
            if entry.seq != expected_seq or first_broken([entry], prev_hash) is not None:
                problem = (
                    "does not match its hash or the entry before it"
                    if entry.seq == expected_seq
                    else f"follows seq {expected_seq - 1}: entries {expected_seq}"
                    f"..{entry.seq - 1} are missing"
                )
                return ChainReport(
                    chain=chain.chain,
                    owner=chain.owner,
                    entries=count + index,
                    broken_at=entry.seq,
                    problem=problem,
                )
            prev_hash, expected_seq = entry.hash, entry.seq + 1
        count += len(page.records)
        if page.next is None:
            break
        after = page.next
    if (expected_seq - 1, prev_hash) != (chain.head_seq, chain.head_hash):
        return ChainReport(
            chain=chain.chain,
            owner=chain.owner,
            entries=count,
            broken_at=expected_seq,
            problem=f"is missing: the chain ends at seq {expected_seq - 1} but its newest "
            f"entry was seq {chain.head_seq} (entries deleted from its end)",
        )
    return ChainReport(chain=chain.chain, owner=chain.owner, entries=count)


async def verify_store(store: SessionStore) -> AsyncIterator[ChainReport]:
    """One report per audit chain (sessions', live or deleted, and POST /aos callers')."""
    async for chain in _chains(store):
        yield await verify_chain(store, chain)
