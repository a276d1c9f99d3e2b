"""The turn engine: owns the agent loop, guards every step, persists at step boundaries.

One `TurnRun` per turn. It emits one stream of `EngineEvent`s (the stream modes are views of
it) and writes history append-only, one atomic `StepWrite` per step. `turn_start` is emitted
once the turn's input is guarded and stored; `turn_stop` exactly once, whatever fails after.
Agent text leaves only as the guardian allows: its text screen releases deltas early (or holds
them) and the whole message is checked before the rest is sent (see `_Streamed`).
`guard_seed` applies the same checks to the history a new session is seeded with.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import msgspec

from aap_server import aos
from aap_server.agent import (
    AgentState,
    KnowledgeItem,
    ModelRequest,
    ModelStop,
    Remember,
    ServerTool,
    StepDeniedError,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolContext,
    ToolError,
    text_of,
)
from aap_server.guardian import CheckScope, FailClosed, TextScreen, asks_for_human, check_scope
from aap_server.ids import new_id, utc_now_iso
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
from aap_server.runtime.errors import InvalidRequestError
from aap_server.runtime.events import AssistantText, EngineEvent, MessageOut
from aap_server.runtime.principal import Principal
from aap_server.runtime.registry import HostedAgent
from aap_server.runtime.steps import (
    StepFactory,
    aos_agent,
    content_of_outputs,
    parts_to_blocks,
    simplify,
    tool_definition,
)
from aap_server.store import AuditDraft, Compaction, PendingToolCall, SessionStore, StepWrite

logger = logging.getLogger("aap_server.turn")

WITHHELD = "Tool result withheld by policy"
# What the model is told of a permission request that was not granted (AAP tool-call.md).
DENIED = "Tool call denied"
EXPIRED = "Tool call not run: the approval request expired"
# A model that keeps calling tools is stopped after this many responses in one turn.
MAX_MODEL_RESPONSES = 25


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def needs_human(tool: ServerTool | None, verdict_data: dict[str, Any] | None) -> bool:
    """Whether a call must wait for a human's approval (an AAP permission request) even in a
    session that trusts the tool: the tool's AOM `a2h_policy` requires authorization, or the
    guardian's verdict asks for it (`asks_for_human`)."""
    if tool is not None and tool.a2h_policy is not None and tool.a2h_policy.requires_authorization:
        return True
    return asks_for_human(verdict_data)


def _step_factory(
    hosted: HostedAgent,
    model_tools: list[ToolSpec],
    client_tool_names: frozenset[str],
    *,
    session_id: str,
    turn_id: str,
    principal: Principal,
) -> StepFactory:
    definitions = [
        tool_definition(spec, "client" if spec.name in client_tool_names else "server")
        for spec in model_tools
    ]
    return StepFactory(
        agent=aos_agent(hosted.agent, definitions),
        session_id=session_id,
        turn_id=turn_id,
        principal=principal,
    )


class _GuardianChecks:
    """The guardian's checks of one session's steps, and their verdicts kept for the audit
    trail until they are written with the next step (so recording costs no extra trip to
    the database)."""

    def __init__(
        self, guardian: FailClosed, session_id: str, turn_id: str, memory: bytes | None = None
    ) -> None:
        self.guardian = guardian
        self.session_id = session_id
        self.turn_id = turn_id
        # The guardian's memory of the session as last stored: taken back before each check,
        # which costs a lookup while the guardian still holds the session (after a restart or
        # an eviction, even mid-turn, it restores what was stored).
        self.memory = memory
        self._audit: list[AuditDraft] = []

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        if self.memory is not None:
            self.guardian.import_session(self.session_id, self.memory)
        started = time.perf_counter_ns()
        # MCP and A2A requests carry no session: the scope tells the guardian whose they are.
        token = check_scope.set(CheckScope(session_id=self.session_id))
        try:
            verdict = await self.guardian.check(request)
        finally:
            check_scope.reset(token)
        data = verdict.data or {}
        self._audit.append(
            AuditDraft(
                turn_id=self.turn_id,
                step_id=str(request.id),
                method=request.method,
                decision=verdict.decision,
                reason_codes=list(verdict.reason_code or []),
                latency_us=(time.perf_counter_ns() - started) // 1000,
                at=utc_now_iso(),
                rule_id=_text_or_none(data.get("ruleId")),
                policy_hash=_text_or_none(data.get("policyHash")),
            )
        )
        return verdict

    def take_audit(self) -> list[AuditDraft]:
        """The verdicts not yet written, handed over to the write that records them."""
        drafts, self._audit = self._audit, []
        return drafts


def _modified_content(verdict: aos.AosSuccessResult, original: Content) -> Content:
    modified = verdict.modified_request
    if isinstance(modified, aos.MessageStep):
        return simplify(parts_to_blocks(modified.params.message.content))
    return original


def _modified_result(verdict: aos.AosSuccessResult, original: Content) -> Content:
    modified = verdict.modified_request
    if isinstance(modified, aos.ToolCallResultStep):
        return content_of_outputs(modified.params.effective_result.outputs)
    return original


def _modified_input(verdict: aos.AosSuccessResult, original: dict[str, Any]) -> dict[str, Any]:
    modified = verdict.modified_request
    if isinstance(modified, aos.ToolCallRequestStep):
        return {arg.name: arg.value for arg in modified.params.tool_call_request.inputs}
    return original


class TurnState(AgentState):
    """Agent-private state: read once per turn, written with the turn's next step."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values
        self._dirty: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def set(self, key: str, value: Any) -> None:
        self._values[key] = value
        self._dirty[key] = value

    def take_changes(self) -> dict[str, Any] | None:
        changes, self._dirty = self._dirty, {}
        return changes or None


class _Stop(Exception):
    """Ends the turn early with a stop reason (a refusal by policy, say)."""

    def __init__(self, reason: StopReason) -> None:
        self.reason = reason


def _message_blocks(thinking: str, text: str) -> list[ContentBlock]:
    """An assistant message's blocks: at most one thinking block, then at most one text block
    (the shape a client's fold of `thinking`/`text` deltas builds)."""
    blocks: list[ContentBlock] = []
    if thinking:
        blocks.append(ThinkingContentBlock(thinking=thinking))
    if text:
        blocks.append(TextContentBlock(text=text))
    return blocks


class _Streamed:
    """One kind of delta (text or thinking) of one message: what the model said, and what
    the guardian's text screen has let out so far."""

    def __init__(
        self,
        screen: TextScreen,
        event: type[TextDeltaEvent] | type[ThinkingDeltaEvent],
        emit: Callable[[EngineEvent], None],
    ) -> None:
        self.screen = screen
        self.event = event
        self.emit = emit
        self.pieces: list[str] = []
        self.released: list[str] = []

    @property
    def whole(self) -> str:
        return "".join(self.pieces)

    def feed(self, delta: str) -> None:
        if delta:
            self.pieces.append(delta)
            self._send(self.screen.feed(delta))

    def finish(self) -> None:
        """The message was allowed: let out what the screen still holds."""
        self._send(self.screen.flush())

    def finish_as(self, modified: str) -> None:
        """The message was modified: send the rest of the modified text, if what already left
        is its beginning (a screen that released text should have caught what gets modified)."""
        sent = "".join(self.released)
        if modified.startswith(sent):
            self._send(modified[len(sent) :])
        else:
            logger.warning("modified agent text differs from text already streamed")

    def _send(self, text: str) -> None:
        if text:
            self.released.append(text)
            self.emit(self.event(delta=text))


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
        guardian_memory: bytes | None = None,
    ) -> None:
        self.hosted = hosted
        self.agent = hosted.agent
        self.store = store
        self.guardian = guardian
        self.session_id = session_id
        self.agent_config = agent_config
        self.client_tools = client_tools
        self.config_changed = config_changed
        self.pending = pending
        self.messages = messages
        self.emit = emit
        self.clock = clock
        self.approval_timeout_seconds = approval_timeout_seconds
        self.options = hosted.effective_options(agent_config)
        self.model_tools, self.trust = hosted.model_tools(agent_config.tools, client_tools)
        self.client_tool_names = frozenset(tool.name for tool in client_tools or [])
        self.steps = _step_factory(
            hosted,
            self.model_tools,
            self.client_tool_names,
            session_id=session_id,
            turn_id=turn_id,
            principal=principal,
        )
        self.checks = _GuardianChecks(guardian, session_id, turn_id, guardian_memory)
        self.context = compacted
        self.state = TurnState(state)
        self.tool_context = _GuardedToolContext(self)
        self._refused = False
        self._granted: list[PendingToolCall] = []

    # --- the turn ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Guard and store the turn's input, then emit `turn_start`. Errors here propagate
        (the API answers them as HTTP errors: nothing has been streamed yet)."""
        self._compaction = self._plan_compaction()
        if isinstance(self.messages[0], UserMessage):
            self._refused = not await self._accept_user_messages()
        else:
            self._granted = await self._accept_tool_answers()
        self.emit(TurnStartEvent())

    async def finish(self) -> None:
        """Run the rest of the turn; emits `turn_stop` exactly once, whatever happens."""
        reason: StopReason = "error"
        try:
            if self._refused:
                reason = "refusal"
            else:
                if self._granted:
                    await self._run_server_tools(self._granted, assistant=None)
                reason = await self._loop()
        except _Stop as stop:
            reason = stop.reason
        except Exception:
            logger.exception("turn %s of session %s failed", self.steps.turn_id, self.session_id)
            reason = "error"
        finally:
            await self._flush_audit()
            self.emit(TurnStopEvent(stop_reason=reason))

    # --- input ------------------------------------------------------------------------------

    def _config_write(self, **fields: Any) -> StepWrite:
        """The input step's write: with it go config overrides and the turn's compaction."""
        fields.setdefault("compaction", self._compaction)
        fields.setdefault("audit", self.checks.take_audit())
        if self.config_changed:
            fields.setdefault("agent", self.agent_config)
            fields.setdefault("tools", self.client_tools)
            fields.setdefault("replace_tools", True)
        return StepWrite(**fields)

    async def _accept_user_messages(self) -> bool:
        # Validation lets user messages in while calls are pending only when every one is a
        # lapsed permission request: close each with the expired notice first, so the model
        # sees a result for every tool_use it made (stored even if the message is refused).
        expired: list[HistoryMessage] = [
            ToolMessage(tool_call_id=call.tool_call_id, content=EXPIRED) for call in self.pending
        ]
        resolved: list[PendingToolCall] | None = [] if self.pending else None
        accepted = list(expired)
        for message in self.messages:
            assert isinstance(message, UserMessage)
            verdict = await self.checks.check(self.steps.message("user", message.content))
            if verdict.decision == "deny":
                write = self._config_write(full=expired, compacted=expired, pending=resolved)
                await self._store(write)
                return False
            if verdict.decision == "modify":
                message = UserMessage(content=_modified_content(verdict, message.content))
            accepted.append(message)
        await self._store(
            self._config_write(
                full=accepted,
                compacted=accepted,
                pending=resolved,
                state=self.state.take_changes(),
            ),
        )
        self.context.extend(accepted)
        return True

    async def _accept_tool_answers(self) -> list[PendingToolCall]:
        """Store client results, permission denials and grants that came too late; return the
        granted calls to run."""
        answers = {m.tool_call_id: m for m in self.messages if not isinstance(m, UserMessage)}
        now = self.clock()
        stored: list[HistoryMessage] = []
        granted: list[PendingToolCall] = []
        for call in self.pending:
            answer = answers[call.tool_call_id]
            if isinstance(answer, ToolPermissionMessage):
                if answer.granted and not call.expired(now):
                    granted.append(call)
                    continue
                # A late denial still says what the human decided; a late grant runs nothing.
                if answer.granted:
                    told = EXPIRED
                else:
                    told = DENIED + (f": {answer.reason}" if answer.reason else "")
                stored.append(ToolMessage(tool_call_id=call.tool_call_id, content=told))
            else:
                content = await self._guard_tool_result(call.tool_call_id, answer.content, False)
                stored.append(ToolMessage(tool_call_id=call.tool_call_id, content=content))
        await self._store(self._config_write(full=stored, compacted=stored, pending=[]))
        self.context.extend(stored)
        return granted

    # --- the loop ---------------------------------------------------------------------------

    async def _loop(self) -> StopReason:
        for _ in range(MAX_MODEL_RESPONSES):
            outcome = await self._respond()
            if outcome is not None:
                return outcome
        return "max_tokens"

    async def _respond(self) -> StopReason | None:
        """One model response and what follows from it; None means: ask the model again."""
        request = ModelRequest(
            session_id=self.session_id,
            instructions=self.agent.instructions,
            history=list(self.context),
            tools=self.model_tools,
            client_tool_names=self.client_tool_names,
            options=self.options,
            memory=await self._recall(),
        )
        # Deltas leave as the guardian's text screen releases them; the rest once the whole
        # message has passed its `steps/message` check.
        thinking = _Streamed(self.guardian.text_screen(), ThinkingDeltaEvent, self.emit)
        text = _Streamed(self.guardian.text_screen(), TextDeltaEvent, self.emit)
        calls: list[ToolCall] = []
        model_stop: StopReason = "end_turn"
        async for output in self.agent.model.respond(request):
            if isinstance(output, TextDelta):
                text.feed(output.text)
            elif isinstance(output, ThinkingDelta):
                thinking.feed(output.text)
            elif isinstance(output, ToolCall):
                calls.append(output)
            elif isinstance(output, Remember):
                await self._remember(output.items)
            elif isinstance(output, ModelStop):
                model_stop = output.reason

        blocks = _message_blocks(thinking.whole, text.whole)
        if blocks:
            verdict = await self.checks.check(self.steps.message("agent", blocks))
            if verdict.decision == "deny":
                raise _Stop("refusal")
            if verdict.decision == "modify":
                modified = _modified_content(verdict, blocks)
                parts = (
                    modified if isinstance(modified, list) else [TextContentBlock(text=modified)]
                )
                new_thinking = "".join(
                    b.thinking for b in parts if isinstance(b, ThinkingContentBlock)
                )
                new_text = "".join(b.text for b in parts if isinstance(b, TextContentBlock))
                blocks = _message_blocks(new_thinking, new_text)
                thinking.finish_as(new_thinking)
                text.finish_as(new_text)
            else:
                thinking.finish()
                text.finish()
            if blocks:
                self.emit(AssistantText(blocks=blocks))

        if not calls:
            if blocks:
                assistant = AssistantMessage(content=simplify(blocks))
                await self._commit([assistant], [assistant])
                self.emit(MessageOut(message=assistant))
            return model_stop

        visible: list[ContentBlock] = list(blocks)
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
                    tool_input = _modified_input(verdict, tool_input)
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

        shown = AssistantMessage(content=simplify(visible)) if visible else None
        told = AssistantMessage(content=simplify(visible + hidden_uses))
        if to_run:
            await self._run_server_tools(
                to_run, assistant=(shown, told, hidden_results), pending=to_ask or None
            )
        else:
            await self._commit(
                [shown] if shown else [], [told, *hidden_results], pending=to_ask or None
            )
            if shown is not None:
                self.emit(MessageOut(message=shown))
        if to_ask:
            return "tool_use"
        return None

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
        assistant: tuple[AssistantMessage | None, AssistantMessage, list[HistoryMessage]] | None,
        pending: list[PendingToolCall] | None = None,
    ) -> None:
        """Run server tools concurrently; emit each result as it is ready; store the calling
        assistant message (if any) and every result in one write, so a crash never leaves a
        tool_use without its result."""
        results: list[ToolMessage] = []

        async def run_one(call: PendingToolCall) -> None:
            content, is_error = await self._execute(call)
            content = await self._guard_tool_result(call.tool_call_id, content, is_error)
            self.emit(ToolResultEvent(tool_call_id=call.tool_call_id, content=content))
            results.append(ToolMessage(tool_call_id=call.tool_call_id, content=content))

        async with asyncio.TaskGroup() as group:
            for call in calls:
                group.create_task(run_one(call))

        full: list[HistoryMessage] = []
        compacted: list[HistoryMessage] = []
        if assistant is not None:
            shown, told, hidden_results = assistant
            if shown is not None:
                full.append(shown)
                self.emit(MessageOut(message=shown))
            compacted.extend([told, *hidden_results])
        full.extend(results)
        compacted.extend(results)
        for message in results:
            self.emit(MessageOut(message=message))
        await self._commit(full, compacted, pending=pending)

    async def _execute(self, call: PendingToolCall) -> tuple[Content, bool]:
        tool: ServerTool = self.hosted.tools_by_name[call.name]
        timeout = tool.timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                return await tool.run(call.input, self.tool_context), False
        except TimeoutError:
            return f"Error: tool {call.name!r} timed out after {timeout:g} s", True
        except ToolError as error:
            return f"Error: {error}", True
        except StepDeniedError as denied:
            return f"Error: denied by policy: {denied.reason}", True
        except Exception:
            logger.exception("server tool %s failed", call.name)
            return f"Error: tool {call.name!r} failed", True

    async def _guard_tool_result(self, call_id: str, content: Content, is_error: bool) -> Content:
        verdict = await self.checks.check(self.steps.tool_call_result(call_id, content, is_error))
        if verdict.decision == "deny":
            return WITHHELD
        if verdict.decision == "modify":
            return _modified_result(verdict, content)
        return content

    # --- memory, knowledge, compaction ------------------------------------------------------

    async def _recall(self) -> list[str]:
        memory = self.agent.memory
        if memory is None:
            return []
        items = await memory.recall(self.state)
        if not items:
            return []
        verdict = await self.checks.check(self.steps.memory_context(items))
        if verdict.decision == "deny":
            return []
        if verdict.decision == "modify" and isinstance(
            verdict.modified_request, aos.MemoryContextRetrievalStep
        ):
            return list(verdict.modified_request.params.memory)
        return items

    async def _remember(self, items: list[str]) -> None:
        memory = self.agent.memory
        if memory is None or not items:
            return
        verdict = await self.checks.check(self.steps.memory_store(items))
        if verdict.decision == "deny":
            return
        if verdict.decision == "modify" and isinstance(
            verdict.modified_request, aos.MemoryStoreStep
        ):
            items = list(verdict.modified_request.params.memory)
        await memory.remember(self.state, items)

    async def retrieve_knowledge(
        self, query: str, keywords: list[str] | None
    ) -> list[KnowledgeItem]:
        knowledge = self.agent.knowledge
        if knowledge is None:
            return []
        items = await knowledge.retrieve(query, keywords)
        verdict = await self.checks.check(self.steps.knowledge_retrieval(query, keywords, items))
        if verdict.decision == "deny":
            return []
        if verdict.decision == "modify" and isinstance(
            verdict.modified_request, aos.KnowledgeRetrievalStep
        ):
            return [
                KnowledgeItem(
                    id=result.id,
                    content=result.content,
                    mime_type=result.mime_type,
                    metadata=result.metadata,
                )
                for result in verdict.modified_request.params.knowledge_step.results
            ]
        return items

    async def guard_protocol(
        self, protocol: str, message: dict[str, Any], direction: str
    ) -> dict[str, Any]:
        if protocol == "MCP":
            request: aos.AosRequest = self.steps.mcp(message, direction)
        else:
            request = self.steps.a2a(message, direction)
        verdict = await self.checks.check(request)
        if verdict.decision == "deny":
            raise StepDeniedError(verdict.message)
        modified = verdict.modified_request
        if verdict.decision == "modify" and isinstance(modified, aos.McpMessage | aos.A2aMessage):
            return modified.params.effective_message
        return message

    def _plan_compaction(self) -> Compaction | None:
        """Compact what the model is fed at the start of each turn, written with the turn's
        input (the store drops and replaces the oldest rows before appending)."""
        strategy = self.agent.compaction
        plan = strategy.plan(self.context) if strategy is not None else None
        if plan is None or plan.drop <= 0:
            return None
        self.context[: plan.drop] = plan.replacement
        return Compaction(drop=plan.drop, replacement=plan.replacement)

    # --- writes (each carries the verdicts not yet recorded) --------------------------------

    async def _store(self, write: StepWrite) -> None:
        """Every write of the turn; the guardian's memory of the session goes with it when
        it changed, so a restart forgets no taint, count or placeholder."""
        memory = self.guardian.export_session(self.session_id)
        if memory is not None:
            write = msgspec.structs.replace(write, guardian_memory=memory)
            self.checks.memory = memory
        await self.store.commit(self.session_id, write)

    async def _flush_audit(self) -> None:
        """Verdicts not yet written (a refusal or failure ended the turn): write them now."""
        audit = self.checks.take_audit()
        if not audit:
            return
        try:
            await self._store(StepWrite(audit=audit))
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


class _GuardedToolContext(ToolContext):
    """The context a server tool runs with; every action goes through the turn's guardian."""

    def __init__(self, run: TurnRun) -> None:
        self._run = run
        self.session_id = run.session_id
        self.options = run.options
        self.state = run.state

    async def retrieve_knowledge(
        self, query: str, keywords: list[str] | None = None
    ) -> list[KnowledgeItem]:
        return await self._run.retrieve_knowledge(query, keywords)

    async def mcp_send(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self._run.guard_protocol("MCP", message, "outbound")

    async def mcp_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self._run.guard_protocol("MCP", message, "inbound")

    async def a2a_send(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self._run.guard_protocol("A2A", message, "outbound")

    async def a2a_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        return await self._run.guard_protocol("A2A", message, "inbound")


async def guard_seed(
    *,
    hosted: HostedAgent,
    guardian: FailClosed,
    principal: Principal,
    session_id: str,
    agent_config: AgentConfig,
    client_tools: list[ToolSpec] | None,
    seed: list[HistoryMessage],
) -> tuple[list[HistoryMessage], list[AuditDraft]]:
    """Guard a new session's seed history (POST /sessions `messages`) message by message as
    the step table guards a turn; returns what to store and the verdicts for the audit trail.

    User and system messages are `steps/message` role user (the client wrote them; AOS has a
    system role, but policies written for client input match `user`), assistant messages role
    agent, tool results `steps/toolCallResult` (the model reads them as tool output, so they
    get the check untrusted content gets). A denial refuses the session, naming the message:
    nothing is stored yet, so the client can fix its request, where a withheld notice would
    store history the client never wrote."""
    if not seed:
        return [], []
    model_tools, _ = hosted.model_tools(agent_config.tools, client_tools)
    steps = _step_factory(
        hosted,
        model_tools,
        frozenset(tool.name for tool in client_tools or []),
        session_id=session_id,
        turn_id=new_id("seed_"),  # the seed is no turn; its verdicts read as such in the audit
        principal=principal,
    )
    checks = _GuardianChecks(guardian, session_id, steps.turn_id)
    guarded: list[HistoryMessage] = []
    for index, message in enumerate(seed):
        request: aos.AosRequest
        if isinstance(message, ToolMessage):
            request = steps.tool_call_result(message.tool_call_id, message.content, False)
        else:
            role = "agent" if isinstance(message, AssistantMessage) else "user"
            request = steps.message(role, message.content)
        verdict = await checks.check(request)
        if verdict.decision == "deny":
            logger.info(
                "new session refused: seed message %d denied by policy (step %s, %s)",
                index,
                request.id,
                ", ".join(verdict.reason_code or []) or "no reason code",
            )
            raise InvalidRequestError(
                f"messages[{index}]: refused by policy: {verdict.message}",
                code="message_refused",
            )
        if verdict.decision == "modify":
            content: Content
            if isinstance(message, ToolMessage):
                content = _modified_result(verdict, message.content)
            else:
                content = _modified_content(verdict, message.content)
            if isinstance(message, SystemMessage):
                content = text_of(content)  # a system message holds plain text only
            message = msgspec.structs.replace(message, content=content)
        guarded.append(message)
    return guarded, checks.take_audit()
