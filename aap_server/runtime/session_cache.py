"""Sessions kept in memory between their turns, so a turn need not read them back (issue 12).

After a turn, this process holds its session as `load_turn` would read it: the record
(agent config, client tools, pending calls), the compacted history, the agent's state and the
guardian's memory, built from the turn's own committed writes. The next turn on the session
here uses it instead of reading, when nobody else can have written the session since:

- one process alone writes the store (SQLite without `--workers`): always, as the turn lock
  is then this process's; anything here that writes a session outside a turn (a deletion,
  the repair of interrupted tool runs) drops its entry;
- a shared store (PostgreSQL, SQLite under `--workers N`): when the version the store read in
  the lease's own transaction (`TurnClaim`, one more per committed step) is the one the
  entry was left at. A write by any other process, or one this process cannot account for,
  makes them differ: the turn reads the session as before.

An entry is taken out while its turn runs and put back only after a turn whose every write
committed; a turn that failed, timed out or lost its lease leaves none. Least recently used
entries go first past `max_sessions` entries or `max_bytes` (as stored: encoded history,
state and guardian memory).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec

from aap_server.protocol import HistoryMessage
from aap_server.store import GuardianMemory, SessionRecord, StepWrite, TurnClaim, TurnSnapshot
from aap_server.store.codec import ENCODER, EncodedStep, decode_record, decode_state

# What an entry costs besides its encoded values (the objects around them), roughly.
ENTRY_OVERHEAD_BYTES = 512

_HISTORY = msgspec.json.Decoder(list[HistoryMessage])  # as `codec.decode_history` reads them


def _memory_bytes(memory: GuardianMemory | None) -> int:
    if memory is None:
        return 0
    return len(memory.snapshot or b"") + sum(map(len, memory.records))


def _as_stored(messages: list[HistoryMessage], rows: list[bytes]) -> list[HistoryMessage]:
    """`messages` as a read of the `rows` the store wrote for them returns them. Messages of
    text alone are those very objects: frozen, holding only strings, which come back from
    JSON as they went in (a string that could not be encoded was not stored). Any other is
    read back from its bytes (a tool call's input may hold a tuple, or a dict an agent could
    change), so that nothing is shared with the writer's objects."""
    for message in messages:
        if type(message.content) is not str:
            return _HISTORY.decode(b"[" + b",".join(rows) + b"]")
    return list(messages)


@dataclass(slots=True)
class CachedSession:
    """One session as its last turn here left it, and the store's version of it then."""

    record: SessionRecord
    compacted: list[HistoryMessage]  # never handed out: a turn gets a copy
    state: dict[str, bytes]  # encoded values, decoded for each turn (agents may mutate them)
    guardian_memory: GuardianMemory | None
    version: int | None  # None: the store is not shared, no version is read
    history_bytes: int
    state_bytes: int
    memory_bytes: int = 0  # of `guardian_memory`, kept in step with it
    # Each of `compacted`'s stored bytes, in order: a compaction takes off what it drops
    # without encoding the history again.
    sizes: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, snapshot: TurnSnapshot, version: int | None) -> CachedSession:
        """An entry from a snapshot the store read (the history is shared: it is decoded
        afresh by the store, and the turn gets a copy of the list)."""
        state = {key: ENCODER.encode(value) for key, value in snapshot.state.items()}
        sizes = [len(ENCODER.encode(message)) for message in snapshot.compacted]
        return cls(
            record=snapshot.record,
            compacted=list(snapshot.compacted),
            state=state,
            guardian_memory=snapshot.guardian_memory,
            version=version,
            history_bytes=sum(sizes),
            state_bytes=sum(map(len, state.values())),
            memory_bytes=_memory_bytes(snapshot.guardian_memory),
            sizes=sizes,
        )

    @property
    def size(self) -> int:
        return ENTRY_OVERHEAD_BYTES + self.history_bytes + self.state_bytes + self.memory_bytes

    def snapshot(self) -> TurnSnapshot:
        """What `load_turn` would return, in objects the turn may change."""
        return TurnSnapshot(
            record=self.record,
            compacted=list(self.compacted),
            state=decode_state(list(self.state.items())),
            guardian_memory=self.guardian_memory,
        )

    def apply(self, write: StepWrite, step: EncodedStep) -> None:
        """The session after the store committed `write`, which it encoded as `step` (as
        `commit` changes it): what is not kept as is comes from the bytes the store wrote,
        and is not encoded again."""
        if step.agent is not None or step.set_tools or step.pending is not None:
            record = self.record
            encode = ENCODER.encode
            if step.set_tools:
                tools = step.tools
            else:
                tools = None if record.tools is None else encode(record.tools)
            self.record = decode_record(
                record.session_id,
                record.owner,
                encode(record.agent) if step.agent is None else step.agent,
                tools,
                encode(record.pending) if step.pending is None else step.pending,
            )
        drop = step.drop
        if drop:
            # The store refuses a drop of more than there is: a commit that succeeded had them.
            replacement = step.replacement
            assert write.compaction is not None  # (what `step.drop` comes from)
            self.compacted[:drop] = _as_stored(write.compaction.replacement, replacement)
            sizes = list(map(len, replacement))
            self.history_bytes += sum(sizes) - sum(self.sizes[:drop])
            self.sizes[:drop] = sizes
        if step.compacted:
            rows = step.compacted
            self.compacted += _as_stored(write.compacted, rows)
            self.sizes += map(len, rows)
            self.history_bytes += sum(map(len, rows))
        for key, encoded in step.state:
            self.state_bytes += len(encoded) - len(self.state.get(key, b""))
            self.state[key] = encoded
        memory = step.guardian_memory
        if memory is not None:
            before = self.guardian_memory
            grown = sum(map(len, memory.records))
            if before is None or memory.snapshot is not None:
                after, self.memory_bytes = memory, len(memory.snapshot or b"") + grown
            else:
                after = before.then(memory)
                self.memory_bytes += grown
            empty = after.snapshot is None and not after.records
            self.guardian_memory = None if empty else after
        if self.version is not None:
            self.version += 1


class SessionCache:
    """Per process, bounded: `max_sessions` entries and `max_bytes` in all (0: no cache)."""

    def __init__(self, max_sessions: int, max_bytes: int) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        # Each entry with its size as counted in `bytes` when it was put.
        self._entries: OrderedDict[str, tuple[CachedSession, int]] = OrderedDict()
        self.bytes = 0
        # Turns that started from an entry / read their session (for tests and metrics).
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def kept_for(self, session_id: str, owner: str) -> bool:
        """Whether `owner`'s session is kept (another owner's is not theirs to be told of)."""
        kept = self._entries.get(session_id)
        return kept is not None and kept[0].record.owner == owner

    def get(self, session_id: str) -> CachedSession | None:
        """The entry kept for the session, if any (as it is, not taken: for inspection)."""
        kept = self._entries.get(session_id)
        return None if kept is None else kept[0]

    def take(self, session_id: str, owner: str, claim: TurnClaim) -> CachedSession | None:
        """The session's entry, taken out for the turn of `owner` that `claim`ed it, if it
        is still current: always when only this process writes the store, else when the
        stored version is the entry's. A stale entry is dropped; another owner's stays."""
        kept = self._entries.get(session_id)
        if kept is None or kept[0].record.owner != owner:
            self.misses += 1
            return None
        entry, size = self._entries.pop(session_id)
        self.bytes -= size
        if claim.shared and (claim.version is None or claim.version != entry.version):
            self.misses += 1
            return None
        self.hits += 1
        return entry

    def put(self, session_id: str, entry: CachedSession) -> None:
        """Keep `entry` (the newest), then drop the least recently used past the bounds."""
        self.drop(session_id)
        size = entry.size
        if not self.max_sessions or size > self.max_bytes:
            return
        self._entries[session_id] = (entry, size)
        self.bytes += size
        while len(self._entries) > self.max_sessions or self.bytes > self.max_bytes:
            _, (_, oldest) = self._entries.popitem(last=False)
            self.bytes -= oldest

    def drop(self, session_id: str) -> None:
        kept = self._entries.pop(session_id, None)
        if kept is not None:
            self.bytes -= kept[1]
