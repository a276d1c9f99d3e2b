"""The turn loop: guards and stores a turn's input, asks the model, acts on what it says.

One `TurnRun` per turn. It emits one stream of `EngineEvent`s (the stream modes are views of
it) and writes history append-only, one atomic `StepWrite` per step. `turn_start` is emitted
once the turn's input is guarded and stored; `turn_stop` exactly once, whatever fails after.
Agent text leaves only as the guardian allows (`streamed.Streamed`); server tools run in
`tool_runs`; memory, knowledge and protocol messages pass `guarded_context`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any, cast

import msgspec

from aap_server.agent import (
    ModelRequest,
    ModelStop,
    Remember,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    Usage,
    text_of,
)
from aap_server.guardian import FailClosed
from aap_server.ids import new_id
from aap_server.protocol import (
    AgentConfig,
    AssistantMessage,
    Content,
    ContentBlock,
    HistoryMessage,
    StopReason,
    SystemMessage,
    TextContentBlock,
    TextDeltaEvent,
    ThinkingContentBlock,
    ThinkingDeltaEvent,
    ToolCallEvent,
    ToolMessage,
    ToolPermissionMessage,
    ToolResultEvent,
    ToolSpec,
    ToolUseContentBlock,
    TurnMessage,
    TurnStartEvent,
    TurnStopEvent,
    UserMessage,
)
from aap_server.runtime.checks import (
    GuardianChecks,
    modified_content,
    modified_input,
    modified_result,
    needs_human,
    refuses_input,
)
from aap_server.runtime.errors import UnavailableError
from aap_server.runtime.events import AssistantText, EngineEvent, MessageOut
from aap_server.runtime.guarded_context import GuardedResources, GuardedToolContext, TurnState
from aap_server.runtime.principal import Principal
from aap_server.runtime.registry import HostedAgent
from aap_server.runtime.steps import StepFactory, simplify
from aap_server.runtime.streamed import Held, Streamed, merge_blocks, message_blocks
from aap_server.runtime.tool_runs import INTERRUPTED, WITHHELD, ToolRunner
from aap_server.runtime.validation import answer_of
from aap_server.store import (
    Compaction,
    GuardianMemory,
    PendingToolCall,
    SessionStore,
    StepWrite,
)
from aap_server.store.codec import EncodedStep

logger = logging.getLogger("aap_server.turn")

# What the model is told of a permission request that was not granted (AAP tool-call.md).
DENIED = "Tool call denied"
EXPIRED = "Tool call not run: the approval request expired"
# A model that keeps calling tools is stopped after this many responses in one turn.
MAX_MODEL_RESPONSES = 25


class _Stop(Exception):
    """Ends the turn early with a stop reason (a refusal by policy, say)."""

    def __init__(self, reason: StopReason) -> None:
        self.reason = reason


class PendingInput:
    """The turn's input write while it waits for the turn's next write, to be committed with
    it (one transaction, one hop fewer); nothing of the turn is acknowledged before it is
    (README "Benchmarks": durability). A stream waits for it (`watch`), and a model that waits
    before the turn's next write has it written alone meanwhile (`TurnRun.finish`)."""

    __slots__ = ("_stored", "error", "flushing", "held")

    def __init__(self, write: StepWrite) -> None:
        self.held: StepWrite | None = write  # no commit has taken it yet
        self.flushing: asyncio.Future[None] | None = None  # its commit alone, under way
        self.error: BaseException | None = None  # what failed the commit that held it
        self._stored: asyncio.Future[None] | None = None  # see `watch`

    @property
    def waiting(self) -> bool:
        """Not yet handed to a commit that the turn has awaited."""
        return self.held is not None or self.flushing is not None

    @property
    def watched(self) -> bool:
        return self._stored is not None

    def take(self) -> StepWrite | None:
        """The held write, for a commit that takes it (merged, or first)."""
        held, self.held = self.held, None
        return held

    def watch(self) -> asyncio.Future[None]:
        """Done once the input is committed; once the turn has ended without that, failed
        with what failed its commit (see `ended`)."""
        if self._stored is None:
            self._stored = asyncio.get_running_loop().create_future()
        return self._stored

    def committed(self) -> None:
        stored = self._stored
        if stored is not None and not stored.done():
            stored.set_result(None)

    def ended(self) -> None:
        """The turn ended (and freed its session): a watcher still waiting is told why."""
        stored = self._stored
        if stored is None or stored.done():
            return
        error = self.error
        if not isinstance(error, Exception):  # stopped (a timeout, shutdown) before it was
            error = UnavailableError("the turn stopped before its input was stored; retry")
        stored.set_exception(error)


class TurnRun:
    """One turn of one session, from its input to its `turn_stop`."""

    def __init__(
        self,
        *,
        hosted: HostedAgent,
        store: SessionStore,
        guardian: FailClosed,
        turn_id: str,
        principal: Principal,
        session_id: str,
        agent_config: AgentConfig,
        client_tools: list[ToolSpec] | None,
        config_changed: bool,
        pending: list[PendingToolCall],
        compacted: list[HistoryMessage],
        state: dict[str, Any],
        messages: list[TurnMessage],
        emit: Callable[[EngineEvent], None],
        clock: Callable[[], float] = time.time,
        approval_timeout_seconds: float = 3600.0,
        guardian_memory: GuardianMemory | None = None,
        refuse_modified_input: bool = False,
        deltas_seen: bool = True,
        defer_input: bool = False,
        defer: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.hosted = hosted
        self.agent = hosted.agent
        self.store = store
        self.guardian = guardian
        self.session_id = session_id
        self.agent_config = agent_config
        self.client_tools = client_tools
        self.config_changed = config_changed
        # Only calls awaiting an answer; answered ones are dropped with the next pending write.
        self.pending = [call for call in pending if call.awaiting] if pending else []
        self.refuse_modified_input = refuse_modified_input
        # No client sees deltas (`none`, `message`): text is only collected (`Held`) and
        # screened once, as the whole message, by its `steps/message` check; the guardian's
        # delta screen would only scan the same text again as it streams.
        self._deltas_seen = deltas_seen
        # No event of the turn reaches the client before it ends (`none`): the input's write
        # goes with the turn's next one (one transaction, one hop fewer), still committed
        # before anything is acknowledged (README "Benchmarks": durability).
        self._defer_input = defer_input
        self.input: PendingInput | None = None  # the input's write, once deferred
        # Where a delta screen's work waits for the stream's reader (`TurnEvents.defer`): a
        # model's burst of deltas is screened once, as one (`Streamed`).
        self._defer_screening = defer
        self.messages = messages
        self.emit = emit
        self.clock = clock
        self.approval_timeout_seconds = approval_timeout_seconds
        self.options = hosted.effective_options(agent_config)
        tools = hosted.tool_set(agent_config.tools, client_tools)  # shared: read only
        self.model_tools, self.trust = tools.model_tools, tools.trust
        self.client_tool_names = tools.client_tool_names
        self.steps = StepFactory(
            agent=tools.aos_agent, session_id=session_id, turn_id=turn_id, principal=principal
        )
        self.checks = GuardianChecks(
            guardian,
            session_id,
            turn_id,
            None if guardian_memory is None else guardian_memory.stream(),
        )
        self.context = compacted
        self.state = TurnState(state, owner=principal.owner)
        self.resources = GuardedResources(self.agent, self.checks, self.steps, self.state)
        self._tools: ToolRunner | None = None  # made when a server tool first runs
        self._refused = False
        # Permission requests the session awaits once the turn stops (for the metrics).
        self.awaiting_permissions = 0
        # Tokens the model reported using in this turn (input, output), summed over responses.
        self.usage = Usage(input_tokens=0, output_tokens=0)
        self._granted: list[PendingToolCall] = []
        # The pending calls the granted ones leave once they have run (answered, not awaiting).
        self._answered: list[PendingToolCall] = []
        # Blocks of the assistant message still open: its response's tool calls were all
        # hidden, so no `tool_call`/`tool_result` closed it in the client's fold and the next
        # response's text belongs to the same message (AAP response.md; one view, three modes).
        self._open: list[ContentBlock] = []
        # The writes the store committed, in order, as it encoded them (the session cache
        # reads what they left from those bytes), and whether one failed (the cache keeps
        # the session only when none did).
        self.committed: list[tuple[StepWrite, EncodedStep]] = []
        self.write_failed = False

    # --- the turn ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Guard and store the turn's input, then emit `turn_start`. Errors here propagate
        (the API answers them as HTTP errors: nothing has been streamed yet)."""
        self._compaction = None
        if self.agent.compaction is not None:
            self._compaction = await self._plan_compaction()
        if isinstance(self.messages[0], UserMessage):
            self._refused = not await self._accept_user_messages()
        else:
            self._granted = await self._accept_tool_answers()
        self.emit(TurnStartEvent())

    async def finish(self) -> StopReason:
        """Run the rest of the turn; emits `turn_stop` exactly once, whatever happens, and
        returns its stop reason."""
        reason: StopReason = "error"
        if self.input is not None and self.input.watched:
            # Runs once this task first waits: if the model waits before the turn's next
            # write, the input is written alone meanwhile (its stream waits for it).
            asyncio.get_running_loop().call_soon(self._flush_input)
        try:
            if self._refused:
                reason = "refusal"
            else:
                if self._granted:
                    await self._run_server_tools(self._granted, None, self._answered)
                reason = await self._loop()
        except _Stop as stop:
            reason = stop.reason
        except Exception:
            logger.exception("turn %s of session %s failed", self.steps.turn_id, self.session_id)
            reason = "error"
        finally:
            if self._open:
                await self._close_open_message()
            if self._unwritten():
                await self.flush_audit()
            self.emit(TurnStopEvent(stop_reason=reason))
        return reason

    # --- input ------------------------------------------------------------------------------

    def _config_write(
        self,
        full: list[HistoryMessage],
        compacted: list[HistoryMessage],
        pending: list[PendingToolCall] | None,
        state: dict[str, Any] | None = None,
    ) -> StepWrite:
        """The input step's write: with it go config overrides and the turn's compaction."""
        changed = self.config_changed
        return StepWrite(
            full=full,
            compacted=compacted,
            pending=pending,
            state=state,
            compaction=self._compaction,
            audit=self.checks.take_audit(),
            agent=self.agent_config if changed else None,
            tools=self.client_tools if changed else None,
            replace_tools=changed,
        )

    async def _accept_user_messages(self) -> bool:
        # Validation lets user messages in while calls are pending only when every one is a
        # lapsed permission request: close each with the expired notice first, so the model
        # sees a result for every tool_use it made (stored even if the message is refused).
        # `full` keeps what the client sent, `compacted` what the model may read (history.md:
        # full is exact): a refused message is stored in full only, a modified one as sent in
        # full and as modified in compacted. `refuse_modified_input` refuses instead of
        # modifying, and then stores no refused input at all (README "History").
        expired: list[HistoryMessage] = [
            ToolMessage(tool_call_id=call.tool_call_id, content=EXPIRED) for call in self.pending
        ]
        resolved: list[PendingToolCall] | None = [] if self.pending else None
        # (the messages are user messages here: validation allows no mix)
        full = cast("list[HistoryMessage]", [*expired, *self.messages])
        accepted = list(expired)
        for message in self.messages:
            assert isinstance(message, UserMessage)
            verdict = await self.checks.check(self.steps.message("user", message.content))
            if refuses_input(verdict, self.refuse_modified_input):
                kept = expired if self.refuse_modified_input else full
                write = self._config_write(full=kept, compacted=expired, pending=resolved)
                await self._store(write, defer=self._defer_input)
                return False
            if verdict.decision == "modify":
                message = UserMessage(content=modified_content(verdict, message.content))
            accepted.append(message)
        await self._store(
            self._config_write(
                full=full,
                compacted=accepted,
                pending=resolved,
                state=self.state.take_changes(),
            ),
            defer=self._defer_input,
        )
        self.context.extend(accepted)
        return True

    async def _accept_tool_answers(self) -> list[PendingToolCall]:
        """Store client results, permission denials and grants that came too late; return the
        granted calls to run."""
        answers = {m.tool_call_id: m for m in self.messages if not isinstance(m, UserMessage)}
        now = self.clock()
        full: list[HistoryMessage] = []
        compacted: list[HistoryMessage] = []
        granted: list[PendingToolCall] = []
        marked: list[PendingToolCall] = []  # each call with its answer (or "running")
        for call in self.pending:
            answer = answers[call.tool_call_id]
            answered = msgspec.structs.replace(call, resolution=answer_of(answer))
            if isinstance(answer, ToolPermissionMessage) and answer.granted:
                if not call.expired(now):
                    # Marked running before it runs: a crash leaves a trace the next load
                    # closes with an error result (never a bare tool_use).
                    granted.append(call)
                    marked.append(msgspec.structs.replace(call, resolution="running"))
                    self._answered.append(answered)
                    continue
                # A late grant runs nothing.
                told: Content = EXPIRED
                said: Content = EXPIRED
            elif isinstance(answer, ToolPermissionMessage):
                # What the human decided; a reason is client text the model reads, guarded as
                # the tool result it becomes (a denied reason leaves the bare denial).
                said = DENIED + (f": {answer.reason}" if answer.reason else "")
                told = said
                if answer.reason:
                    told = await self._guard_client_result(call.tool_call_id, said, DENIED)
            else:
                said = answer.content
                told = await self._guard_client_result(call.tool_call_id, said, WITHHELD)
            marked.append(answered)
            self._answered.append(answered)
            stored_full = said if not self.refuse_modified_input or said == told else told
            full.append(ToolMessage(tool_call_id=call.tool_call_id, content=stored_full))
            compacted.append(ToolMessage(tool_call_id=call.tool_call_id, content=told))
        await self._store(self._config_write(full=full, compacted=compacted, pending=marked))
        self.context.extend(compacted)
        return granted

    async def _guard_client_result(self, call_id: str, content: Content, refused: str) -> Content:
        """A client-supplied tool result as the model may read it: `refused` if denied (or
        modified, when the deployment refuses modified input)."""
        verdict = await self.checks.check(self.steps.tool_call_result(call_id, content, False))
        if refuses_input(verdict, self.refuse_modified_input):
            return refused
        if verdict.decision == "modify":
            return modified_result(verdict, content)
        return content

    # --- the loop ---------------------------------------------------------------------------

    async def _loop(self) -> StopReason:
        for _ in range(MAX_MODEL_RESPONSES):
            outcome = await self._respond()
            if outcome is not None:
                return outcome
        # AAP response.md reserves `max_tokens` for the context window; a server-imposed cap
        # on responses is the server stopping the turn mid-way: `error`. The history is whole
        # (every tool_use has its result), so the client can go on with a new message.
        logger.warning(
            "turn %s stopped after %d model responses", self.steps.turn_id, MAX_MODEL_RESPONSES
        )
        return "error"

    async def _respond(self) -> StopReason | None:
        """One model response and what follows from it; None means: ask the model again."""
        request = ModelRequest(
            session_id=self.session_id,
            instructions=self.agent.instructions,
            history=list(self.context),
            tools=self.model_tools,
            client_tool_names=self.client_tool_names,
            options=self.options,
            memory=await self.resources.recall() if self.agent.memory is not None else [],
        )
        # Deltas leave as the guardian's text screen releases them; the rest once the whole
        # message has passed its `steps/message` check.
        thinking: Streamed | Held
        text: Streamed | Held
        opened = self._open  # the client's open message, continued by this response's text
        if self._deltas_seen:
            streamed = Streamed(
                self.guardian.text_screen(),
                ThinkingDeltaEvent,
                self.emit,
                sent="".join(b.thinking for b in opened if isinstance(b, ThinkingContentBlock)),
                defer=self._defer_screening,
            )
            text = Streamed(
                self.guardian.text_screen(),
                TextDeltaEvent,
                self.emit,
                after=streamed,
                sent="".join(b.text for b in opened if isinstance(b, TextContentBlock)),
                defer=self._defer_screening,
            )
            thinking = streamed
        else:
            thinking, text = Held(), Held()
        calls: list[ToolCall] = []
        model_stop: StopReason = "end_turn"
        feed_text, feed_thinking = text.feed, thinking.feed  # once, not per delta
        async for output in self.agent.model.respond(request):
            if isinstance(output, TextDelta):
                feed_text(output.text)
            elif isinstance(output, ThinkingDelta):
                feed_thinking(output.text)
            elif isinstance(output, ToolCall):
                calls.append(output)
            elif isinstance(output, Remember):
                await self.resources.remember(output.items)
            elif isinstance(output, ModelStop):
                model_stop = output.reason
            elif isinstance(output, Usage):
                self.usage = Usage(
                    input_tokens=self.usage.input_tokens + output.input_tokens,
                    output_tokens=self.usage.output_tokens + output.output_tokens,
                )

        if self._deltas_seen:  # (held text waits for its check anyway)
            thinking.whole_now()
            text.whole_now()
        blocks = message_blocks(thinking.whole, text.whole)
        # The client's fold of the open message (this response's alone if none was open).
        said = merge_blocks(opened + blocks) if opened else blocks
        self._open = []
        if blocks:
            # Checked as the client will see it, with the text left open before it: each kind
            # as one text (a thinking block between the two halves of a card splits no card).
            checked = blocks if not opened else message_blocks(*_texts_of(said))
            verdict = await self.checks.check(
                self.steps.message("agent", checked, cited=self.resources.take_citations())
            )
            if verdict.decision == "deny":
                raise _Stop("refusal")
            if verdict.decision == "modify":
                modified = modified_content(verdict, checked)
                parts: list[ContentBlock] = (
                    modified if isinstance(modified, list) else [TextContentBlock(text=modified)]
                )
                new_thinking, new_text = _texts_of(parts)
                # (with text left open, the model's view of this response is the whole message;
                # the history shows what the client holds: text already sent stays)
                blocks = message_blocks(new_thinking, new_text)
                said = message_blocks(thinking.finish_as(new_thinking), text.finish_as(new_text))
            else:
                thinking.finish()
                text.finish()

        if not calls:
            if said:
                self.emit(AssistantText(blocks=said))
                shown = AssistantMessage(content=simplify(said))
                told = shown if said is blocks else AssistantMessage(content=simplify(blocks))
                await self._commit([shown], [told] if blocks else [])
                self.emit(MessageOut(message=shown))
            return model_stop

        visible: list[ContentBlock] = list(said)
        hidden_uses: list[ContentBlock] = []
        hidden_results: list[HistoryMessage] = []
        to_run: list[PendingToolCall] = []
        to_ask: list[PendingToolCall] = []
        for call in calls:
            call_id = new_id("call_")
            tool_input = call.input
            refusal = self._unavailable(call.name)
            needs_approval = False
            if refusal is None:
                verdict = await self.checks.check(
                    self.steps.tool_call_request(call_id, call.name, tool_input)
                )
                if verdict.decision == "deny":
                    refusal = f"Tool call denied by policy: {verdict.message}"
                elif verdict.decision == "modify":
                    tool_input = modified_input(verdict, tool_input)
                # The tool or the guardian may ask for a human: the call then waits for the
                # client's permission even if the session trusts the tool (DESIGN; AOM A2H).
                tool = self.hosted.tools_by_name.get(call.name)
                needs_approval = needs_human(tool, verdict.data)
            use = ToolUseContentBlock(tool_call_id=call_id, name=call.name, input=tool_input)
            if refusal is not None:
                # The client never sees it; the model is told why it did not happen.
                hidden_uses.append(use)
                hidden_results.append(ToolMessage(tool_call_id=call_id, content=refusal))
                continue
            if len(visible) == len(said) and said:
                self.emit(AssistantText(blocks=said))  # the message's text, before its calls
            visible.append(use)
            self.emit(ToolCallEvent(tool_call_id=call_id, name=call.name, input=tool_input))
            client = call.name in self.client_tool_names
            ask = client or needs_approval or not self.trust.get(call.name, False)
            pending = PendingToolCall(
                tool_call_id=call_id,
                name=call.name,
                input=tool_input,
                kind="client" if client else "permission",
                # A permission request lapses; a client's tool result is awaited however long.
                expires_at=self._approval_deadline() if ask and not client else None,
            )
            (to_ask if ask else to_run).append(pending)

        told = AssistantMessage(content=simplify(blocks + visible[len(said) :] + hidden_uses))
        if len(visible) == len(said):
            # Every call was hidden: nothing closes the message in the client's fold, so it
            # stays open for the next response's text (stored in full once it closes).
            self._open = said
            await self._commit([], [told, *hidden_results])
            return None
        shown = AssistantMessage(content=simplify(visible))
        # Calls answered earlier in this turn stay listed (a resubmitted answer is recognised).
        after = [*self._answered, *to_ask]
        if to_run:
            await self._run_server_tools(to_run, (shown, told, hidden_results), after)
        else:
            await self._commit([shown], [told, *hidden_results], pending=after or None)
            self.emit(MessageOut(message=shown))
        if to_ask:
            self.awaiting_permissions = sum(call.kind == "permission" for call in to_ask)
            return "tool_use"
        return None

    def _tool_runner(self) -> ToolRunner:
        if self._tools is None:
            self._tools = ToolRunner(
                self.hosted.tools_by_name,
                GuardedToolContext(self.resources, self.session_id, self.options),
                self.checks,
                self.steps,
            )
        return self._tools

    def _approval_deadline(self) -> float | None:
        timeout = self.approval_timeout_seconds
        return self.clock() + timeout if math.isfinite(timeout) else None

    def _unavailable(self, name: str) -> str | None:
        if name in self.client_tool_names or name in self.trust:
            return None
        return f"Tool {name!r} is not available in this session"

    # --- server tools -----------------------------------------------------------------------

    async def _run_server_tools(
        self,
        calls: list[PendingToolCall],
        assistant: tuple[AssistantMessage, AssistantMessage, list[HistoryMessage]] | None,
        pending: list[PendingToolCall],
    ) -> None:
        """Run server tools concurrently and emit each result as it is ready. The calling
        assistant message (if any) is stored first with the calls marked running, and every
        result in one write after: a crash leaves running marks that the next load closes with
        error results; a timeout or shutdown cancel writes those error results at once."""
        if assistant is not None:
            shown, told, hidden_results = assistant
            running = [msgspec.structs.replace(c, resolution="running") for c in calls]
            await self._commit([shown], [told, *hidden_results], pending=[*pending, *running])
            self.emit(MessageOut(message=shown))
        results: list[ToolMessage] = []

        def on_result(result: ToolMessage) -> None:
            results.append(result)
            self.emit(ToolResultEvent(tool_call_id=result.tool_call_id, content=result.content))

        async def record() -> None:
            for message in results:
                self.emit(MessageOut(message=message))
            await self._commit(list(results), list(results), pending=pending)

        try:
            await self._tool_runner().run_all(calls, on_result)
        except asyncio.CancelledError:
            done = {result.tool_call_id for result in results}
            for call in calls:
                if call.tool_call_id not in done:
                    on_result(ToolMessage(tool_call_id=call.tool_call_id, content=INTERRUPTED))
            await record()
            raise
        await record()

    # --- compaction ---------------------------------------------------------------------------

    async def _plan_compaction(self) -> Compaction | None:
        """Compact what the model is fed at the start of each turn, written with the turn's
        input (the store drops and replaces the oldest rows before appending). What the agent
        puts in place of the dropped messages goes back to the model: each message is checked
        as agent content (`steps/message` role agent); a denied one is left out."""
        strategy = self.agent.compaction
        plan = strategy.plan(self.context) if strategy is not None else None
        if plan is None or plan.drop <= 0:
            return None
        replacement: list[HistoryMessage] = []
        for message in plan.replacement:
            content = message.content
            verdict = await self.checks.check(self.steps.message("agent", content))
            if verdict.decision == "deny":
                continue
            if verdict.decision == "modify":
                content = modified_content(verdict, content)
                if isinstance(message, SystemMessage):
                    content = text_of(content)
            replacement.append(msgspec.structs.replace(message, content=content))
        self.context[: plan.drop] = replacement
        return Compaction(drop=plan.drop, replacement=replacement)

    # --- writes (each carries the verdicts not yet recorded) --------------------------------

    async def _store(self, write: StepWrite, *, defer: bool = False) -> None:
        """Every write of the turn. A `defer`red write is held and committed with the next
        one (or by `flush_audit` at the turn's end)."""
        pending = self.input
        if pending is not None and pending.flushing is not None:
            flushing, pending.flushing = pending.flushing, None
            await flushing  # in order; a step whose input was not stored is not stored
        held = pending.take() if pending is not None else None
        if defer:
            self.input = PendingInput(write if held is None else merged(held, write))
            return
        if held is not None:
            if held.compaction is not None and write.compaction is not None:
                await self._commit_write(self._with_memory(held), holds_input=True)
                held = None
            else:
                write = merged(held, write)
        await self._commit_write(self._with_memory(write), holds_input=held is not None)

    def _with_memory(self, write: StepWrite) -> StepWrite:
        """`write` as committed: with what the guardian learned of the session since its last
        export (a record of the changes, now and then a whole one), so a restart forgets no
        taint, count or placeholder. Taken per commit, not per step: a deferred write's
        learning goes with the commit that holds it, as one record."""
        exported = self.guardian.export_session(self.session_id)
        if exported is None:
            return write
        self.checks.remember(exported.record, exported.whole)
        memory = GuardianMemory.written(*exported)
        return msgspec.structs.replace(write, guardian_memory=memory)

    def _flush_input(self) -> None:
        """The turn's task waits with the input still deferred: write it now, alone."""
        pending = self.input
        write = pending.take() if pending is not None else None
        if pending is not None and write is not None:
            pending.flushing = asyncio.ensure_future(
                self._commit_write(self._with_memory(write), holds_input=True)
            )

    async def _commit_write(self, write: StepWrite, *, holds_input: bool = False) -> None:
        """Commit `write`; `holds_input`: it is the first to hold the deferred input."""
        try:
            step = await self.store.commit(self.session_id, write)
        except BaseException as error:
            self.write_failed = True
            if holds_input and self.input is not None:
                self.input.error = error
            if write.guardian_memory is not None:  # the stored records miss this one now
                self.guardian.memory_not_stored(self.session_id)
            raise
        self.committed.append((write, step))  # (the bytes the store wrote: the session cache's)
        if holds_input and self.input is not None:
            self.input.committed()

    async def _close_open_message(self) -> None:
        """The turn ended with an assistant message still open (its calls were hidden): the
        client's fold closes it at `turn_stop`, so the views and `full` get it now."""
        if not self._open:
            return
        self.emit(AssistantText(blocks=self._open))
        shown = AssistantMessage(content=simplify(self._open))
        self._open = []
        try:
            await self._store(StepWrite(full=[shown], audit=self.checks.take_audit()))
        except Exception:
            logger.exception("could not store the last message of turn %s", self.steps.turn_id)
        self.emit(MessageOut(message=shown))

    def _unwritten(self) -> bool:
        """Whether verdicts, or the deferred input, wait for a write."""
        return bool(self.checks.unwritten) or (self.input is not None and self.input.waiting)

    async def flush_audit(self) -> None:
        """Verdicts not yet written (a refusal or failure ended the turn): write them now."""
        if not self._unwritten():
            return
        try:
            await self._store(StepWrite(audit=self.checks.take_audit()))
        except Exception:
            logger.exception("could not record the audit trail of turn %s", self.steps.turn_id)

    async def _commit(
        self,
        full: list[HistoryMessage],
        compacted: list[HistoryMessage],
        pending: list[PendingToolCall] | None = None,
    ) -> None:
        write = StepWrite(
            full=full,
            compacted=compacted,
            pending=pending,
            state=self.state.take_changes(),
            audit=self.checks.take_audit(),
        )
        await self._store(write)
        self.context.extend(compacted)


def _texts_of(blocks: list[ContentBlock]) -> tuple[str, str]:
    """A message's thinking and its text, each joined."""
    thinking = "".join(b.thinking for b in blocks if isinstance(b, ThinkingContentBlock))
    return thinking, "".join(b.text for b in blocks if isinstance(b, TextContentBlock))


def merged(first: StepWrite, then: StepWrite) -> StepWrite:
    """`first` and `then` as one write, equal to committing them in that order (at most one
    of them compacts: the store drops before it appends)."""
    return StepWrite(
        full=[*first.full, *then.full],
        compacted=[*first.compacted, *then.compacted],
        agent=then.agent if then.agent is not None else first.agent,
        tools=then.tools if then.replace_tools else first.tools,
        replace_tools=first.replace_tools or then.replace_tools,
        pending=then.pending if then.pending is not None else first.pending,
        compaction=then.compaction if then.compaction is not None else first.compaction,
        state={**(first.state or {}), **(then.state or {})} or None,
        audit=[*first.audit, *then.audit],
        guardian_memory=(
            first.guardian_memory.then(then.guardian_memory)
            if first.guardian_memory is not None and then.guardian_memory is not None
            else then.guardian_memory or first.guardian_memory
        ),
    )
