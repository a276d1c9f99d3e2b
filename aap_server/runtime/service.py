"""The AAP operations, independent of HTTP: sessions, history, and starting turns.

The API layer authenticates, decodes and calls these; each raises only domain errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextvars import Token
from typing import Any

from aap_server.guardian import FailClosed, Guardian
from aap_server.ids import new_id
from aap_server.protocol import (
    AgentConfig,
    GetAuditResponse,
    GetMetaResponse,
    GetSessionsResponse,
    HistoryType,
    PostSessionsRequest,
    PostSessionsResponse,
    PostSessionTurnRequest,
    SessionInfo,
    StopReason,
    StreamMode,
    TurnMessage,
    TurnStartEvent,
    TurnStopEvent,
)
from aap_server.runtime.deadline import TurnDeadlines
from aap_server.runtime.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    UnavailableError,
)
from aap_server.runtime.events import EngineEvent, TurnEvents
from aap_server.runtime.limits import PrincipalLimits
from aap_server.runtime.principal import Principal
from aap_server.runtime.registry import (
    SECRET_PLACEHOLDER,
    AgentRegistry,
    HostedAgent,
    redact_all,
)
from aap_server.runtime.seed import guard_client_config, guard_new_session
from aap_server.runtime.session_cache import CachedSession, SessionCache
from aap_server.runtime.tool_runs import close_interrupted
from aap_server.runtime.triggered import Trigger, admit_trigger
from aap_server.runtime.turn import TurnRun
from aap_server.runtime.turn_lease import TurnLeases
from aap_server.runtime.validation import (
    RequestLimits,
    check_limits,
    drop_replayed_answers,
    validate_new_session,
    validate_overrides,
    validate_seed,
    validate_stream_mode,
    validate_turn_messages,
)
from aap_server.store import (
    GuardianMemory,
    HistoryChangedError,
    HistoryPage,
    InvalidCursorError,
    PendingToolCall,
    SessionRecord,
    SessionStore,
    StepWrite,
    TurnClaim,
    TurnFence,
    TurnInProgressError,
    TurnSnapshot,
    turn_fence,
)
from aap_server.telemetry import Telemetry, TurnObservation

logger = logging.getLogger("aap_server.service")


def _invalid_cursor() -> InvalidRequestError:
    return InvalidRequestError(
        "after: not a cursor this server issued; pass the `next` value of a previous page",
        code="invalid_cursor",
    )


def _awaiting_permission(pending: list[PendingToolCall]) -> int:
    return sum(call.awaiting and call.kind == "permission" for call in pending)


def _session_not_found(session_id: str) -> NotFoundError:
    return NotFoundError(f"session {session_id!r} not found", code="session_not_found")


def _without_placeholders(
    hosted: HostedAgent, options: dict[str, str] | None
) -> dict[str, str] | None:
    """Options without secret ones that only echo the `***` mask a client was shown: the
    stored secret stays (a new session takes the option's default)."""
    if not options:
        return options
    kept = {
        key: value
        for key, value in options.items()
        if not (key in hosted.secret_options and value == SECRET_PLACEHOLDER)
    }
    return kept or None


class Turn:
    """A started turn: its events, already past `turn_start`, arrive through a queue that the
    turn's own task fills, so a client that goes away does not stop the turn. A `none` turn
    has no reader until it ends: the request's task runs it before `start_turn` returns, and
    its queue then holds every event (see `AapService._run_inline`)."""

    def __init__(self, turn_id: str, mode: StreamMode) -> None:
        self.turn_id = turn_id
        self.mode = mode
        self.queue = TurnEvents()
        # A streamed turn's input is written with its next step (one transaction), or alone
        # once the model waits first: this is done when it is stored (`PendingInput.watch`).
        self._input: asyncio.Future[None] | None = None

    async def stored(self) -> None:
        """Until the turn's input is stored: nothing of the turn may be sent before. Raises
        what failed its write (once the turn has freed its session), as `start_turn` raises
        what fails before: the request is answered with that error, nothing streamed."""
        if self._input is not None:
            await self._input

    async def events(self) -> AsyncIterator[EngineEvent]:
        await self.stored()
        while (event := await self.queue.get()) is not None:
            yield event


class AapService:
    def __init__(
        self,
        *,
        registry: AgentRegistry,
        store: SessionStore,
        guardian: Guardian,
        guardian_timeout_seconds: float = 2.0,
        turn_timeout_seconds: float = 300.0,
        page_size: int = 20,
        approval_timeout_seconds: float = 3600.0,
        clock: Callable[[], float] = time.time,
        refuse_modified_input: bool = False,
        limits: RequestLimits | None = None,
        telemetry: Telemetry | None = None,
        principal_limits: PrincipalLimits | None = None,
        turn_lease_seconds: float = 30.0,
        session_cache_sessions: int = 10_000,
        session_cache_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.registry = registry
        self.store = store
        self.guardian = FailClosed(guardian, guardian_timeout_seconds)
        self.turn_timeout_seconds = turn_timeout_seconds
        self._deadlines = TurnDeadlines()  # every running turn's, watched by one timer
        self.page_size = page_size
        # How long a permission request waits for its `tool_permission` (math.inf: forever);
        # after that a grant runs nothing and a user message may move the session on.
        self.approval_timeout_seconds = approval_timeout_seconds
        self.clock = clock  # unix seconds; tests swap in their own
        # A guardian's `modify` of client input refuses it instead, and refused input is not
        # stored: raw sensitive input never reaches storage (`full` is exact otherwise).
        self.refuse_modified_input = refuse_modified_input
        self.limits = limits or RequestLimits()
        self.telemetry = telemetry or Telemetry()
        self._active: dict[str, str] = {}  # session id -> running turn id
        # The same rule across replicas sharing a database (see runtime/turn_lease.py).
        self.leases = TurnLeases(store, turn_lease_seconds)
        # The tasks running turns: each streamed turn's own, and the request's task while it
        # runs a `none` turn inline (shutdown waits for them all, then cancels them).
        self._tasks: set[asyncio.Task[Any]] = set()
        # The requests in `start_turn` (an inline `none` turn runs to its end in it).
        self._starting: set[asyncio.Task[Any]] = set()
        # Set once none is (made by a shutdown that finds some: only they touch it then).
        self._all_started: asyncio.Event | None = None
        self._deleting: set[str] = set()  # sessions whose DELETE is in progress
        self._accepting = True
        self._shutdown: asyncio.Future[None] | None = None  # see `shutdown`
        # Concurrent turns per principal.
        self.principal_limits = principal_limits or PrincipalLimits()
        self.leases.max_turns = self.principal_limits.max_concurrent_turns  # across replicas
        # Sessions as this process's last turn on them left them (runtime/session_cache.py).
        self.sessions = SessionCache(session_cache_sessions, session_cache_bytes)

    # --- meta and sessions ------------------------------------------------------------------

    def meta(self) -> GetMetaResponse:
        return GetMetaResponse(version=3, agents=self.registry.infos)

    async def create_session(
        self, principal: Principal, request: PostSessionsRequest
    ) -> PostSessionsResponse:
        seed = request.messages or []
        check_limits(self.limits, seed, request.agent.options, request.tools)
        hosted = self.registry.get(request.agent.name)
        validate_new_session(hosted, request.agent, request.tools)
        validate_seed(hosted, seed)
        options = _without_placeholders(hosted, request.agent.options)
        record = SessionRecord(
            session_id=new_id("sess_"),
            owner=principal.owner,
            agent=AgentConfig(name=request.agent.name, tools=request.agent.tools, options=options),
            tools=request.tools,
        )
        # Options, tool definitions and the seed are client input the model will read:
        # guarded like a turn's input (a denial raises, and no session is created).
        with self.telemetry.session_scope(hosted.agent, record.session_id).scoped():
            guarded, audit = await guard_new_session(
                hosted=hosted,
                guardian=self.guardian,
                principal=principal,
                session_id=record.session_id,
                agent_config=record.agent,
                client_tools=record.tools,
                seed=seed,
                refuse_modified_input=self.refuse_modified_input,
            )
        exported = self.guardian.export_session(record.session_id)
        memory = None if exported is None else GuardianMemory.written(*exported)
        if guarded == seed:
            await self.store.create_session(record, seed, audit=audit, guardian_memory=memory)
        else:
            # `full` keeps the seed the client sent, `compacted` the guarded one: the store
            # takes one list at creation, so the seed follows in the session's first write.
            await self.store.create_session(record, [], audit=audit, guardian_memory=memory)
            try:
                await self.store.commit(record.session_id, StepWrite(full=seed, compacted=guarded))
            except BaseException:
                await self.store.delete_session(record.session_id, principal.owner)
                raise
        return PostSessionsResponse(session_id=record.session_id)

    async def _record(self, principal: Principal, session_id: str) -> SessionRecord:
        record = await self.store.get_session(session_id, principal.owner)
        if record is None:
            raise _session_not_found(session_id)
        return record

    def _hosted(self, record: SessionRecord) -> HostedAgent:
        hosted = self.registry.find(record.agent.name)
        if hosted is None:
            raise NotFoundError(
                f"the agent {record.agent.name!r} of session {record.session_id!r} is no "
                "longer hosted here",
                code="agent_not_hosted",
            )
        return hosted

    def _info(self, record: SessionRecord) -> SessionInfo:
        hosted = self.registry.find(record.agent.name)
        # An agent no longer hosted here cannot say which options were secret: mask them all.
        agent = hosted.redact(record.agent) if hosted else redact_all(record.agent)
        return SessionInfo(session_id=record.session_id, agent=agent, tools=record.tools)

    async def get_session(self, principal: Principal, session_id: str) -> SessionInfo:
        return self._info(await self._record(principal, session_id))

    async def list_sessions(self, principal: Principal, after: str | None) -> GetSessionsResponse:
        try:
            page = await self.store.list_sessions(principal.owner, after, self.page_size)
        except InvalidCursorError as error:
            raise _invalid_cursor() from error
        return GetSessionsResponse(
            sessions=[self._info(record) for record in page.sessions], next=page.next
        )

    async def delete_session(self, principal: Principal, session_id: str) -> None:
        """Deletes the session, unless a turn is running on it (409, like a second turn:
        the running turn would otherwise fail half-way writing into a session that is gone)."""
        await self._refuse_if_busy(principal, session_id)
        if (holder := await self.leases.holder(session_id)) is not None:  # another replica's
            await self._record(principal, session_id)
            raise _turn_in_progress(session_id, holder)
        self._deleting.add(session_id)  # no turn may start while the rows go
        self.sessions.drop(session_id)
        try:
            deleted = await self.store.delete_session(session_id, principal.owner)
        except TurnInProgressError as error:  # taken on another replica since the check
            raise _turn_in_progress(session_id, error.holder) from error
        finally:
            self._deleting.discard(session_id)
        if not deleted:
            raise _session_not_found(session_id)
        self.telemetry.awaiting_approvals(session_id, 0)

    async def _refuse_if_busy(self, principal: Principal, session_id: str) -> None:
        """409 while a turn runs on the session; 404 while it is being deleted."""
        if session_id not in self._active and session_id not in self._deleting:
            return
        await self._record(principal, session_id)  # not yours: 404, whatever it is doing
        if session_id in self._deleting:
            raise _session_not_found(session_id)
        active = self._active.get(session_id)
        if active is not None:
            raise _turn_in_progress(session_id, active)
        # The turn ended while the record was read: the session is free.

    async def audit(
        self, principal: Principal, session_id: str, after: str | None
    ) -> GetAuditResponse:
        """The session's guardian verdicts, oldest first (owner only)."""
        await self._record(principal, session_id)
        try:
            page = await self.store.load_audit(session_id, after, self.page_size)
        except InvalidCursorError as error:
            raise _invalid_cursor() from error
        return GetAuditResponse(records=page.records, next=page.next)

    async def history_page(
        self,
        principal: Principal,
        session_id: str,
        kind: HistoryType,
        after: str | None,
        limit: int,
        max_bytes: int,
    ) -> HistoryPage:
        """A page of the session's history of the requested type (see `history`), read
        from the store by index range, however long the history is."""
        await self._history_ready(principal, session_id, kind)
        return await self.history_page_after(session_id, kind, after, limit, max_bytes)

    async def history_page_after(
        self, session_id: str, kind: HistoryType, after: str | None, limit: int, max_bytes: int
    ) -> HistoryPage:
        """The page after `after` of a history `history_page` already checked access to."""
        try:
            return await self.store.load_history_page(session_id, kind, after, limit, max_bytes)
        except InvalidCursorError as error:
            raise InvalidRequestError(
                "after: not a cursor of this history; pass the `next` value of a previous page",
                code="invalid_cursor",
            ) from error
        except HistoryChangedError as error:
            raise ConflictError(
                "after: the compacted history was compacted since this cursor was issued; "
                "read it again from the first page (without `after`)",
                code="history_changed",
            ) from error

    async def _history_ready(
        self, principal: Principal, session_id: str, kind: HistoryType
    ) -> None:
        """Whether the principal may read this history (NotFoundError if not); first closes
        tool calls a crashed turn left running, as a turn would."""
        record = await self._record(principal, session_id)
        hosted = self._hosted(record)
        declared = hosted.info.capabilities.history if hosted.info.capabilities else None
        if declared is None or getattr(declared, kind) is None:
            raise NotFoundError(
                f"type: agent {hosted.name!r} does not provide {kind} history",
                code="history_not_supported",
            )
        interrupted = any(call.resolution == "running" for call in record.pending)
        if interrupted and session_id not in self._active:
            repair = new_id(_REPAIR_PREFIX)
            self._active[session_id] = repair  # as a turn would: nothing else writes meanwhile
            try:
                # A tool still running in another replica's turn is not interrupted: repair
                # only with the lease (read again under it: that turn may have just ended).
                if await self.leases.take(session_id, repair) is None:
                    current = await self._record(principal, session_id)
                    fence = turn_fence.set(TurnFence(session_id, repair))
                    self.sessions.drop(session_id)
                    try:
                        await self._close_interrupted(session_id, current.pending)
                    except BaseException:  # cut short: its write may still be landing
                        await self.store.writes_settled()
                        raise
                    finally:
                        turn_fence.reset(fence)
            finally:
                self._active.pop(session_id, None)
                await self.leases.release(session_id, repair)

    # --- turns ------------------------------------------------------------------------------

    async def start_turn(
        self,
        principal: Principal,
        session_id: str,
        request: PostSessionTurnRequest,
        trigger: Trigger | None = None,
    ) -> Turn:
        """Validate, take the session's turn lock, guard and store the input, and return the
        turn with `turn_start` queued. Every error here is raised before anything streams.
        A turn no user started has a `trigger`, guarded first (`runtime/triggered`)."""
        if not self._accepting:
            raise UnavailableError("the server is shutting down; retry shortly")
        # Counted from here, not from when its task runs: a shutdown begun while the input
        # is still in its checks waits for it (else the turn would go on on a closed store).
        task = asyncio.current_task()
        assert task is not None
        self._starting.add(task)
        try:
            return await self._start_turn(principal, session_id, request, trigger, task)
        finally:
            self._starting.discard(task)
            if not self._starting and self._all_started is not None:
                self._all_started.set()

    async def _start_turn(
        self,
        principal: Principal,
        session_id: str,
        request: PostSessionTurnRequest,
        trigger: Trigger | None,
        task: asyncio.Task[Any],
    ) -> Turn:
        """`start_turn` in the request's `task`."""
        options = request.agent.options if request.agent is not None else None
        check_limits(self.limits, request.messages, options, request.tools)
        if session_id in self._active or session_id in self._deleting:
            await self._refuse_if_busy(principal, session_id)
        # Take the lock first, then read everything the turn needs in one go: the previous
        # turn stored its results before releasing the lock, so this read is current.
        turn = Turn(new_id("turn_"), request.stream or "none")
        self.principal_limits.start_turn(principal.owner)
        self._active[session_id] = turn.turn_id
        observed: TurnObservation | None = None
        running = False  # once the turn's task runs, the task frees what the turn holds
        fence: Token[TurnFence | None] | None = None
        kept: CachedSession | None = None  # the session as the turn found it (cache on)
        run: TurnRun | None = None
        inline = False  # a `none` turn: run below by this task, with the fence still set
        try:
            # A session kept in memory is not read again: the quota check its read would
            # have made is made in the lease's transaction instead.
            claim = await self.leases.claim(
                session_id,
                turn.turn_id,
                principal.owner,
                check_quota=self.sessions.kept_for(session_id, principal.owner),
            )
            if claim.holder is not None:
                await self._record(principal, session_id)  # not yours: 404, busy or not
                raise _turn_in_progress(session_id, claim.holder)
            # The turn's writes (here and in its task, which inherits this) are stored only
            # while it still holds the lease: a replica whose lease lapsed writes nothing.
            fence = turn_fence.set(TurnFence(session_id, turn.turn_id))
            kept, snapshot = await self._load_turn(principal, session_id, claim)
            hosted = self._hosted(snapshot.record)
            observed = self.telemetry.turn_started(
                hosted.agent, session_id, turn.turn_id, turn.mode
            )
            observed_token = observed.enter()  # the input's checks are steps of the turn
            try:
                validate_stream_mode(hosted, turn.mode)
                validate_overrides(hosted, request.agent, request.tools)
                repaired = await self._repaired(snapshot)
                if repaired is not snapshot:  # written outside the turn: read next time
                    snapshot, kept = repaired, None
                pending = snapshot.record.pending
                messages = drop_replayed_answers(request.messages, pending)
                if request.messages and not messages:
                    # Every answer was taken already: acknowledge, run and store nothing.
                    waiting = any(call.awaiting for call in pending)
                    stop = TurnStopEvent(stop_reason="tool_use" if waiting else "end_turn")
                    for event in (TurnStartEvent(), stop, None):
                        turn.queue.put_nowait(event)
                    observed.stopped(stop.stop_reason, _awaiting_permission(pending))
                    return turn
                validate_turn_messages(hosted, messages, pending, self.clock())
                run = self._prepare(hosted, snapshot, request, messages, principal, turn)
                if trigger is not None:
                    await admit_trigger(run, trigger)
                if request.agent is not None or request.tools is not None:
                    try:
                        await guard_client_config(
                            run.checks, run.steps, options, hosted.secret_options, request.tools
                        )
                    except InvalidRequestError:
                        await run.flush_audit()  # the refusal is on the audit trail too
                        raise
                await run.start()
            finally:
                observed.leave(observed_token)
            if turn.mode == "none":
                inline = True
            else:
                if run.input is not None:
                    turn._input = run.input.watch()
                own = asyncio.create_task(self._finish(run, turn, principal, observed, kept))
            running = True
        except BaseException as error:
            if observed is not None:
                observed.rejected(error)
            raise
        finally:
            if fence is not None and not inline:
                turn_fence.reset(fence)
            if not running:  # refused, or nothing to run
                if run is not None and run.write_failed:
                    await self.store.writes_settled()  # see _finish
                elif kept is not None and (run is None or not run.committed):
                    self.sessions.put(session_id, kept)  # nothing written: still the session
                await self._end_turn(principal, session_id, turn.turn_id)
        if inline:
            assert fence is not None
            try:
                await self._run_inline(run, turn, principal, observed, kept, task)
            finally:
                turn_fence.reset(fence)
            return turn
        self._tasks.add(own)
        own.add_done_callback(self._tasks.discard)
        return turn

    async def _run_inline(
        self,
        run: TurnRun,
        turn: Turn,
        principal: Principal,
        observed: TurnObservation,
        kept: CachedSession | None,
        task: asyncio.Task[Any],
    ) -> None:
        """A `none` turn, run to its end by the request's own `task`: no client reads its
        events before it ends, so a task of its own, a hand-off per event and a wake-up of
        the reader would only cost. The request's task stands for the turn's meanwhile:
        shutdown waits for it and stops it as it would the turn's task, and the turn then
        ends with `turn_stop` `error` as a stopped task's does (the request answers it). A
        hang-up does not stop it (uvicorn does not cancel a request's task when its client
        goes away; any other cancellation stops the turn, stored and freed as at shutdown)."""
        self._tasks.add(task)
        try:
            await self._finish(run, turn, principal, observed, kept, task)
        except asyncio.CancelledError:
            if self._accepting or task.uncancel() > 0:
                raise  # not the shutdown stopping the turn: the cancellation goes on
        finally:
            self._tasks.discard(task)

    async def _load_turn(
        self, principal: Principal, session_id: str, claim: TurnClaim
    ) -> tuple[CachedSession | None, TurnSnapshot]:
        """What the turn starts from, kept in memory if current, else read (404 if the
        session is not the principal's); and the entry its writes will update (None: the
        cache is off)."""
        cached = self.sessions.take(session_id, principal.owner, claim)
        if cached is not None:
            return cached, cached.snapshot()
        snapshot = await self.store.load_turn(session_id, principal.owner)
        if snapshot is None:
            raise _session_not_found(session_id)
        if not self.sessions.max_sessions:
            return None, snapshot
        # Taken before the turn changes the snapshot's list and state.
        return CachedSession.of(snapshot, claim.version), snapshot

    def _keep(self, run: TurnRun, kept: CachedSession | None, completed: bool) -> None:
        """Keep the session as the turn's writes left it, if every one of them committed
        and the turn ended as it should; else forget it (the next turn reads it)."""
        if kept is None or not completed or run.write_failed:
            self.sessions.drop(run.session_id)
            return
        try:
            for write, step in run.committed:
                kept.apply(write, step)
        except Exception:  # never in the way of ending the turn: the next one reads
            logger.exception("session %s: could not keep it in memory", run.session_id)
            self.sessions.drop(run.session_id)
            return
        self.sessions.put(run.session_id, kept)  # (in place of any entry)

    async def _end_turn(self, principal: Principal, session_id: str, turn_id: str) -> None:
        """Free what a turn holds: its session (here and across replicas), its principal's slot."""
        self._active.pop(session_id, None)
        self.principal_limits.end_turn(principal.owner)
        await self.leases.release(session_id, turn_id)

    def _prepare(
        self,
        hosted: HostedAgent,
        snapshot: TurnSnapshot,
        request: PostSessionTurnRequest,
        messages: list[TurnMessage],
        principal: Principal,
        turn: Turn,
    ) -> TurnRun:
        record = snapshot.record
        overrides = request.agent
        agent_config = record.agent
        new_options = _without_placeholders(hosted, overrides.options if overrides else None)
        if overrides is not None and (overrides.tools is not None or new_options):
            agent_config = AgentConfig(
                name=record.agent.name,
                tools=overrides.tools if overrides.tools is not None else record.agent.tools,
                options={**(record.agent.options or {}), **(new_options or {})} or None,
            )
        client_tools = request.tools if request.tools is not None else record.tools
        return TurnRun(
            hosted=hosted,
            store=self.store,
            guardian=self.guardian,
            turn_id=turn.turn_id,
            principal=principal,
            session_id=record.session_id,
            agent_config=agent_config,
            client_tools=client_tools,
            config_changed=agent_config is not record.agent or request.tools is not None,
            pending=record.pending,
            compacted=snapshot.compacted,
            state=snapshot.state,
            messages=messages,
            emit=turn.queue.put_nowait,
            defer=turn.queue.defer,
            clock=self.clock,
            approval_timeout_seconds=self.approval_timeout_seconds,
            guardian_memory=snapshot.guardian_memory,
            refuse_modified_input=self.refuse_modified_input,
            deltas_seen=turn.mode == "delta",
            defer_input=True,
        )

    async def _close_interrupted(self, session_id: str, pending: list[PendingToolCall]) -> bool:
        """Close tool calls a crash left running with error results (history then never
        holds a granted or trusted tool_use without its result). Call holding the turn lock."""
        closed = close_interrupted(pending)
        if closed is None:
            return False
        results, answered = closed
        logger.warning("session %s: closing %d interrupted tool runs", session_id, len(results))
        write = StepWrite(full=list(results), compacted=list(results), pending=answered)
        await self.store.commit(session_id, write)
        return True

    async def _repaired(self, snapshot: TurnSnapshot) -> TurnSnapshot:
        record = snapshot.record
        if not await self._close_interrupted(record.session_id, record.pending):
            return snapshot
        reloaded = await self.store.load_turn(record.session_id, record.owner)
        if reloaded is None:
            raise _session_not_found(record.session_id)
        return reloaded

    async def _finish(
        self,
        run: TurnRun,
        turn: Turn,
        principal: Principal,
        observed: TurnObservation,
        kept: CachedSession | None,
        task: asyncio.Task[Any] | None = None,
    ) -> None:
        """The rest of the turn, run by `task` (None: the current one)."""
        observed_token = observed.enter()
        reason: StopReason = "error"  # what `finish` emits when it is cancelled
        completed = False
        deadline = self._deadlines.start(self.turn_timeout_seconds, task)
        try:
            reason = await run.finish()
        except asyncio.CancelledError as error:
            if not deadline.stop(error):
                raise
            logger.warning("turn %s timed out", turn.turn_id)
        else:
            completed = reason != "error"
        finally:
            deadline.stop(None)  # no cancellation of this task once the turn has ended
            try:
                if run.write_failed:  # cut short (a timeout): its write may still be landing
                    await self.store.writes_settled()
                # Before the lock goes: the next turn here finds what this one left.
                self._keep(run, kept, completed)
                await self._end_turn(principal, run.session_id, turn.turn_id)
            finally:  # the client's stream ends whatever freeing the turn raised
                if turn._input is not None and run.input is not None:
                    run.input.ended()  # its stream is told, if it still waits
                turn.queue.put_nowait(None)
                observed.stopped(reason, run.awaiting_permissions, run.usage)
                observed.leave(observed_token)  # the request's context, when run inline

    async def shutdown(self, grace_seconds: float) -> None:
        """Take no new turns; let running ones finish within the grace period, then stop them
        (each still ends with `turn_stop`). Once: a later call (the app closing after a drain
        ran it) waits for the first to end, with no grace period of its own."""
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._stop_turns(grace_seconds))
        await asyncio.shield(self._shutdown)

    async def _stop_turns(self, grace_seconds: float) -> None:
        self._accepting = False
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + grace_seconds
        # Turns still starting become running turns (or are refused) first.
        if self._starting:
            self._all_started = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_seconds):
                    await self._all_started.wait()
        tasks = set(self._tasks)
        if not tasks:
            return
        _, still_running = await asyncio.wait(tasks, timeout=max(0.0, ends_at - loop.time()))
        # Only tasks still running a turn: a request's task past its inline `none` turn is
        # writing the answer, which is the client's.
        stopping = [task for task in still_running if task in self._tasks]
        for task in stopping:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*stopping, return_exceptions=True)


_REPAIR_PREFIX = "repair_"  # the lease holder while a read closes interrupted tool runs


def _turn_in_progress(session_id: str, turn_id: str) -> ConflictError:
    if turn_id.startswith(_REPAIR_PREFIX):  # no turn to name: a history read is repairing
        return ConflictError(
            f"session {session_id!r} is closing interrupted tool runs; retry shortly",
            code="turn_in_progress",
            retry_after_seconds=1,
        )
    return ConflictError(
        f"session {session_id!r} is running turn {turn_id}; one turn at a time",
        code="turn_in_progress",
        details={"activeTurnId": turn_id},
        retry_after_seconds=1,
    )
