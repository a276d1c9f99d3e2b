"""The turn loop: guards and stores a turn's input, asks the model, acts on what it says.

One `TurnRun` per turn. It emits one stream of `EngineEvent`s (the stream modes are views of
it) and writes history append-only, one atomic `StepWrite` per step. `turn_start` is emitted
once the turn's input is guarded and stored; `turn_stop` exactly once, whatever fails after.
Agent text leaves only as the guardian allows (`streamed.Streamed`); server tools run in
`tool_runs`; memory, knowledge and protocol messages pass `guarded_context`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import msgspec

from aap_server.agent import (
    ModelRequest,
    ModelStop,
    Remember,
    TextDelta,
    ThinkingDelta,
    ToolCall,
)
from aap_server.guardian import FailClosed
from aap_server.ids import new_id
from aap_server.protocol import (
    AgentConfig,
    AssistantMessage,
    ContentBlock,
    HistoryMessage,
    StopReason,
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
    needs_human,
    step_factory,
)
from aap_server.runtime.events import AssistantText, EngineEvent, MessageOut
from aap_server.runtime.guarded_context import GuardedResources, GuardedToolContext, TurnState
from aap_server.runtime.principal import Principal
from aap_server.runtime.registry import HostedAgent
from aap_server.runtime.steps import simplify
from aap_server.runtime.streamed import Streamed, message_blocks
from aap_server.runtime.tool_runs import ToolRunner
from aap_server.store import Compaction, PendingToolCall, SessionStore, StepWrite

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
        self.steps = step_factory(
            hosted,
            self.model_tools,
            self.client_tool_names,
            session_id=session_id,
            turn_id=turn_id,
            principal=principal,
        )
        self.checks = GuardianChecks(guardian, session_id, turn_id, guardian_memory)
        self.context = compacted
        self.state = TurnState(state)
        self.resources = GuardedResources(self.agent, self.checks, self.steps, self.state)
        self.tools = ToolRunner(
            hosted.tools_by_name,
            GuardedToolContext(self.resources, session_id, self.options),
            self.checks,
            self.steps,
        )
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
                message = UserMessage(content=modified_content(verdict, message.content))
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
                content = await self.tools.guard_result(call.tool_call_id, answer.content, False)
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
            memory=await self.resources.recall(),
        )
        # Deltas leave as the guardian's text screen releases them; the rest once the whole
        # message has passed its `steps/message` check.
        thinking = Streamed(self.guardian.text_screen(), ThinkingDeltaEvent, self.emit)
        text = Streamed(self.guardian.text_screen(), TextDeltaEvent, self.emit)
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
                await self.resources.remember(output.items)
            elif isinstance(output, ModelStop):
                model_stop = output.reason

        blocks = message_blocks(thinking.whole, text.whole)
        if blocks:
            verdict = await self.checks.check(self.steps.message("agent", blocks))
            if verdict.decision == "deny":
                raise _Stop("refusal")
            if verdict.decision == "modify":
                modified = modified_content(verdict, blocks)
                parts = (
                    modified if isinstance(modified, list) else [TextContentBlock(text=modified)]
                )
                new_thinking = "".join(
                    b.thinking for b in parts if isinstance(b, ThinkingContentBlock)
                )
                new_text = "".join(b.text for b in parts if isinstance(b, TextContentBlock))
                blocks = message_blocks(new_thinking, new_text)
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
        results = await self.tools.run_all(
            calls,
            lambda result: self.emit(
                ToolResultEvent(tool_call_id=result.tool_call_id, content=result.content)
            ),
        )

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

    # --- compaction ---------------------------------------------------------------------------

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
