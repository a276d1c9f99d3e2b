"""The session store contract: what the runtime and API need from durable storage."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from aap_server.protocol import AgentConfig, AuditEntry, HistoryMessage, ToolSpec
from aap_server.store.audit import GENESIS_HASH, AuditDraft
from aap_server.store.memory_lock import PROCESS_LOCKS, deadline_after

if TYPE_CHECKING:
    from aap_server.store.codec import EncodedStep

HistoryKind = Literal["full", "compacted"]
PendingKind = Literal["client", "permission"]


class PendingToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call the last turn stopped on: a client tool awaiting its result, or a server
    tool awaiting the client's permission (untrusted, or a human's approval was asked for)."""

    tool_call_id: str
    name: str
    input: dict[str, Any]
    kind: PendingKind
    # When a permission request lapses (unix seconds). None: never (client calls, and every
    # call stored before approvals could expire).
    expires_at: float | None = None
    # Where the call stands. None: awaiting the client's answer. "running": the tool was
    # started and its result is not stored yet (after a crash, the next load closes it with an
    # error result). Otherwise the client's answer, kept until the next calls replace it so a
    # resubmitted answer is recognised: "granted", "denied" or "result:<digest of content>".
    resolution: str | None = None

    @property
    def awaiting(self) -> bool:
        return self.resolution is None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class SessionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A stored session. `agent.options` holds real secret values: redact before showing."""

    session_id: str
    owner: str
    agent: AgentConfig
    tools: list[ToolSpec] | None = None
    pending: list[PendingToolCall] = msgspec.field(default_factory=list)


class Compaction(msgspec.Struct, frozen=True, kw_only=True):
    """Drop the oldest `drop` compacted messages and put `replacement` (at most `drop`
    messages, e.g. a summary) in their place, before anything else is appended."""

    drop: int
    replacement: list[HistoryMessage] = msgspec.field(default_factory=list)


class GuardianMemory(msgspec.Struct, frozen=True, kw_only=True):
    """The guardian's memory of a session, opaque to the store: a sequence of records taken
    back in order (`snapshot`, if any, then `records`, oldest first).

    In a write: a `snapshot` replaces what was stored (snapshot and records), and `records`
    are appended after it, so a step costs the store what it adds, not the whole memory."""

    snapshot: bytes | None = None
    records: tuple[bytes, ...] = ()

    @classmethod
    def written(cls, record: bytes, whole: bool) -> GuardianMemory:
        """One record to store: a `whole` one replaces everything stored before it."""
        return cls(snapshot=record) if whole else cls(records=(record,))

    def stream(self) -> list[bytes]:
        """The records in the order they are taken back."""
        head = [] if self.snapshot is None else [self.snapshot]
        return [*head, *self.records]

    def then(self, later: GuardianMemory) -> GuardianMemory:
        """This write followed by `later`, as one."""
        if later.snapshot is not None:
            return later
        return GuardianMemory(snapshot=self.snapshot, records=(*self.records, *later.records))


class StepWrite(msgspec.Struct, frozen=True, kw_only=True):
    """Everything one step changes, written atomically in one call to the database thread."""

    full: list[HistoryMessage] = msgspec.field(default_factory=list)
    compacted: list[HistoryMessage] = msgspec.field(default_factory=list)
    # When set, replaces the session's agent config / client tools / pending tool calls.
    agent: AgentConfig | None = None
    tools: list[ToolSpec] | None = None
    replace_tools: bool = False
    pending: list[PendingToolCall] | None = None
    compaction: Compaction | None = None
    # Agent-private per-session state to upsert (key -> JSON-encodable value).
    state: dict[str, Any] | None = None
    # Guardian verdicts to append to the session's hash-chained audit trail.
    audit: list[AuditDraft] = msgspec.field(default_factory=list)
    # When set, what the guardian's stored memory of the session gains (`GuardianMemory`).
    guardian_memory: GuardianMemory | None = None


class TurnSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What a turn starts from, read in one go."""

    record: SessionRecord
    compacted: list[HistoryMessage]
    state: dict[str, Any]
    # The guardian's memory of the session as stored (None: nothing yet).
    guardian_memory: GuardianMemory | None = None


class TurnClaim(msgspec.Struct, frozen=True, kw_only=True):
    """What claiming a session's turn lease found (`SessionStore.claim_turn`)."""

    # None: claimed; otherwise the turn (on some replica) that holds the lease.
    holder: str | None = None
    # Other processes may write the session (a store shared with them): `version` was read
    # in the claim's own transaction. False: this process is the only writer.
    shared: bool = False
    # The session's stored version (see `claim_turn`); None when the session does not exist
    # or the store is not shared.
    version: int | None = None


class SessionPage(msgspec.Struct, frozen=True, kw_only=True):
    sessions: list[SessionRecord]
    # Opaque cursor for the next page; None on the last page.
    next: str | None = None


class HistoryPage(msgspec.Struct, frozen=True, kw_only=True):
    messages: list[HistoryMessage]
    # Opaque cursor for the next page; None on the last page.
    next: str | None = None


class HistoryChangedError(Exception):
    """The compacted history was compacted since the cursor was issued: its pages no longer
    follow on from each other; read it again from the start."""


class AuditPage(msgspec.Struct, frozen=True, kw_only=True):
    records: list[AuditEntry]
    next: str | None = None


class StoreUnavailableError(Exception):
    """The database could not be reached (or the connection broke where a retry was not
    safe); the operation may be retried later. The API answers 503."""


class TurnInProgressError(Exception):
    """A turn (`holder`, on some replica) holds the session's lease: it cannot be deleted
    now, and a write fenced to another turn's lease (`StepWrite.lease`) is refused."""

    def __init__(self, session_id: str, holder: str) -> None:
        super().__init__(f"session {session_id!r} is held by turn {holder}")
        self.holder = holder


class LeaseLostError(Exception):
    """A write fenced to a turn (`turn_fence`) found that turn no longer holds the session's
    lease (it lapsed, and perhaps another replica's turn took it): nothing was written."""


@dataclass(frozen=True, slots=True)
class TurnFence:
    """The turn whose lease a session's writes must hold (see `turn_fence`)."""

    session_id: str
    turn_id: str


turn_fence: ContextVar[TurnFence | None] = ContextVar("aap_turn_fence", default=None)
"""Set by the runtime while a turn holding the session's lease runs (its task inherits it):
a store shared by several processes then commits that session's steps only while the lease
is still the turn's, checked in the commit's own transaction."""


class InvalidCursorError(ValueError):
    """The `after` cursor was not one this store issued."""


class StoreLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Per-owner quotas, checked from counters the store keeps (never by counting rows):
    `max_sessions` when a session is created, `max_stored_bytes` (history, agent state and
    audit entries, as stored) when a session is created, a turn starts or a POST /aos
    verdict is recorded. 0: no limit."""

    max_sessions: int = 0
    max_stored_bytes: int = 0
    # POST /aos callers' guardian memory (see `CallerMemory`): bytes kept per caller (least
    # recently written sessions go first), and tainted sessions remembered as forgotten per
    # caller (past that, every session of the caller with nothing stored counts as tainted).
    caller_memory_bytes: int = 16 * 1024 * 1024
    caller_forgotten_sessions: int = 50_000


QuotaKind = Literal["sessions", "stored_bytes", "turns"]


class QuotaExceededError(Exception):
    """The owner is at one of its `StoreLimits`; nothing was written."""

    def __init__(self, kind: QuotaKind, limit: int, used: int) -> None:
        super().__init__(f"{kind}: {used} of {limit} used")
        self.kind = kind
        self.limit = limit
        self.used = used


class AuditChain(msgspec.Struct, frozen=True, kw_only=True):
    """One hash chain of audit entries: a session's (kept `audit_retention` after the session
    is deleted) or a POST /aos caller's (`caller_chain`; entries older than the retention are
    pruned from its front). The entries start at `start_seq`, whose prev_hash is
    `start_hash` (GENESIS_HASH unless older entries were pruned), and end at `head_seq`."""

    chain: str
    owner: str
    ended_at_ms: int | None
    start_seq: int
    start_hash: str
    # The newest entry appended (start_seq - 1 and start_hash while there is none): a chain
    # whose last entry is not this one lost entries from its end.
    head_seq: int = -1
    head_hash: str = GENESIS_HASH


class CallerMemory(msgspec.Struct, frozen=True, kw_only=True):
    """What the guardian remembers of one session of a POST /aos caller, as stored: a
    snapshot (`memory`, the guardian's whole export) and the change records after it
    (`records`, oldest first), taken back in that order.

    Read `after` a version the reader holds, only the records after it (`memory` None,
    `after` set); else (`after` None) the snapshot and all records. `memory` None with
    `forgotten` when the session was tainted and pushed out by the caller's byte cap (or the
    caller forgot too many such sessions to name them): the guardian must take the worst.
    `version` is what a save must name to add to it (0: nothing stored)."""

    memory: bytes | None = None
    records: tuple[bytes, ...] = ()
    after: int | None = None
    forgotten: bool = False
    version: int = 0


# Counted per stored caller memory row besides its blob and session id (so no number of
# empty sessions escapes the caller's byte cap).
CALLER_MEMORY_ROW_BYTES = 64


def caller_chain(owner: str) -> str:
    """The audit chain of POST /aos verdicts given to `owner` (session ids never hold ':')."""
    return f"aos:{owner}"


class SessionStore(abc.ABC):
    """Async session storage. Implementations keep history append-only: a step's cost must
    not grow with the length of the history before it."""

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect and apply pending schema migrations."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish pending writes and release the database."""

    @abc.abstractmethod
    async def create_session(
        self,
        record: SessionRecord,
        seed: list[HistoryMessage],
        *,
        audit: Sequence[AuditDraft] = (),
        guardian_memory: GuardianMemory | None = None,
    ) -> None:
        """Store a new session with its seed history (both full and compacted), the
        guardian's verdicts on that seed (the first entries of its audit trail) and what the
        guardian learned from it."""

    @abc.abstractmethod
    async def get_session(self, session_id: str, owner: str) -> SessionRecord | None:
        """The session if it exists and belongs to `owner`."""

    @abc.abstractmethod
    async def list_sessions(self, owner: str, after: str | None, limit: int) -> SessionPage:
        """Newest first, keyset-paged; raises InvalidCursorError for a malformed `after`."""

    @abc.abstractmethod
    async def delete_session(self, session_id: str, owner: str) -> bool:
        """Remove the session, its history and its state; False if there was none. Its audit
        chain stays (see `prune_audit`). TurnInProgressError (nothing removed) while a turn
        holds the session's lease: taken by the deletion itself, so no turn starts meanwhile."""

    @abc.abstractmethod
    async def load_history(self, session_id: str, kind: HistoryKind) -> list[HistoryMessage]:
        """The whole history of one kind, oldest first."""

    @abc.abstractmethod
    async def load_history_page(
        self, session_id: str, kind: HistoryKind, after: str | None, limit: int, max_bytes: int
    ) -> HistoryPage:
        """Up to `limit` messages of one kind, oldest first, after the cursor `after`, and no
        more of them than fit in `max_bytes` as stored (but at least one): index range
        reads, whatever the history's length. InvalidCursorError for a cursor of another
        session's history kind or not issued here; HistoryChangedError when the compacted
        history was compacted since the cursor was issued."""

    @abc.abstractmethod
    async def load_turn(self, session_id: str, owner: str) -> TurnSnapshot | None:
        """The session (if `owner`'s), its compacted history and its state, read together.
        QuotaExceededError when the owner is at its stored-bytes quota (a turn would add)."""

    @abc.abstractmethod
    async def commit(self, session_id: str, write: StepWrite) -> EncodedStep:
        """Apply one step's writes atomically (all or nothing). LeaseLostError (nothing
        written) when `turn_fence` names this session and its turn's lease is gone. Adds
        exactly one to the session's version (see `claim_turn`) per write stored, also when
        a backend stores several writes in one transaction: a process counts its own. (A
        store only this process writes, whose claims read no version, need not count.)
        Returns the write as it encoded and stored it (`codec.encode_step`): a caller keeping
        what it wrote (the runtime's session cache) reads those bytes back instead of encoding
        the write again."""

    async def writes_settled(self) -> None:
        """Return once every write issued before has been stored or refused, including one
        whose caller was cancelled: a turn cut short frees its session only after this, so
        a write it handed over cannot land under the next turn. Here: a backend that rolls
        a cancelled write back before the call returns."""
        return None

    @abc.abstractmethod
    async def load_audit(self, chain: str, after: str | None, limit: int) -> AuditPage:
        """A chain's audit entries (a session id, or `caller_chain(owner)`), oldest first,
        keyset-paged; InvalidCursorError for a bad `after`."""

    @abc.abstractmethod
    async def append_audit(self, chain: str, owner: str, drafts: Sequence[AuditDraft]) -> None:
        """Append verdicts to a chain that is not a session's (a POST /aos caller's);
        QuotaExceededError (nothing written) when the owner is at its stored-bytes quota."""

    @abc.abstractmethod
    async def list_audit_chains(self, after: str | None, limit: int) -> list[AuditChain]:
        """Every audit chain, ordered by name, after the chain named `after`."""

    @abc.abstractmethod
    async def prune_audit(self, before_ms: int, batch: int = 1000) -> int:
        """Drop the chains of sessions deleted before `before_ms` (unix ms) and caller
        entries given before it (each caller chain keeps at least its newest entry), at most
        about `batch` of each per call; returns how many chains and entries went (0: done)."""

    @abc.abstractmethod
    async def load_state(self, session_id: str) -> dict[str, Any]:
        """The agent-private state of a session (empty when none was stored)."""

    # -- POST /aos callers' guardian memory ------------------------------------------------

    @abc.abstractmethod
    async def load_caller_memory(
        self, caller: str, session_id: str, after: int | None = None
    ) -> CallerMemory:
        """The stored guardian memory of a caller's session: with `after` (a version the
        caller read or saved), only the records after it when they follow it (one indexed
        row and a range of the log), else the snapshot and all its records."""

    @abc.abstractmethod
    async def save_caller_memory(
        self,
        caller: str,
        session_id: str,
        memory: bytes,
        *,
        tainted: bool,
        version: int,
        whole: bool = True,
    ) -> bool:
        """Add one record to the memory loaded at `version`: a `whole` one replaces it (the new
        snapshot), any other is appended to its log (`tainted` then says whether the record
        adds taint). False (nothing written) if the memory changed since, or a change record
        has nothing stored to follow. Keeps the caller under `StoreLimits.caller_memory_bytes`
        (snapshot and records counted) by pushing out its least recently saved sessions (a
        tainted one is remembered as forgotten)."""

    def hold_caller_memory(
        self, caller: str, session_id: str, wait_seconds: float
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold a caller's session for one read-check-save of its memory: no other check of
        it runs meanwhile in this process (here: a store no other process uses) nor, in a
        store several processes share, in any of them. TimeoutError (nothing held) when not
        had within `wait_seconds`. An optimisation, not the rule: a save still names the
        version it read (see `save_caller_memory`), which catches what a lock let through."""
        return PROCESS_LOCKS.hold((caller, session_id), deadline_after(wait_seconds))

    # -- the turn lease: one turn per session across every process sharing the database -----
    #
    # A store that only one process opens (SQLite with one worker) keeps the defaults: the
    # runtime's in-process lock is then the whole rule. A shared store (PostgreSQL, SQLite
    # under `serve --workers N`) keeps the lease in the database, with an expiry so that a
    # process that dies holding it does not lock the session forever.

    async def take_turn(
        self,
        session_id: str,
        turn_id: str,
        ttl_seconds: float,
        *,
        owner: str = "",
        max_turns: int = 0,
    ) -> str | None:
        """Claim the session's turn lease for `ttl_seconds`: None when claimed, otherwise the
        id of the turn (on some replica) that holds an unexpired lease. With `max_turns`,
        QuotaExceededError ("turns") when `owner` already holds that many leases on any
        replica (checked and taken atomically)."""
        claim = await self.claim_turn(
            session_id, turn_id, ttl_seconds, owner=owner, max_turns=max_turns
        )
        return claim.holder

    @abc.abstractmethod
    async def claim_turn(
        self,
        session_id: str,
        turn_id: str,
        ttl_seconds: float,
        *,
        owner: str = "",
        max_turns: int = 0,
        check_quota: bool = False,
    ) -> TurnClaim:
        """`take_turn`, and once claimed, in the same transaction: the session's version
        (a shared store; a counter every `commit` to the session adds one to, so a process
        that knows the version after its own last write knows nobody wrote since) and, with
        `check_quota`, `owner`'s stored-bytes quota as `load_turn` checks it
        (QuotaExceededError "stored_bytes", nothing claimed). A store only this process
        writes reads no version (`TurnClaim.shared` False) and claims nothing."""

    async def renew_turn(self, session_id: str, turn_id: str, ttl_seconds: float) -> bool:
        """Extend `turn_id`'s lease; False when it lapsed and another turn took it."""
        return True

    async def release_turn(self, session_id: str, turn_id: str) -> None:
        """Give the lease up (only `turn_id`'s own: a lapsed and retaken one stays)."""
        return None

    async def turn_holder(self, session_id: str) -> str | None:
        """The turn holding an unexpired lease on the session, if any."""
        return None
