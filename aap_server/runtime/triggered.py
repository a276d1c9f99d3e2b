"""Turns no user started (an inbound A2A call): guarded as `steps/agentTrigger` before they run.

The inbound protocol message is checked first (`protocols/A2A`, inbound), then the trigger it
makes (`steps/agentTrigger`); a deny of either runs nothing (`TriggerDeniedError`, the refusal on
the session's audit trail); a modify runs the turn on the modified trigger. The turn itself is an
ordinary turn of an ordinary session (its input is guarded again as a user `steps/message`), and
the reply, before it goes back, is checked as an outbound protocol message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aap_server import aos
from aap_server.agent import StepDeniedError
from aap_server.protocol import (
    AgentConfig,
    AssistantMessage,
    PostSessionsRequest,
    PostSessionTurnRequest,
    StopReason,
    TextContentBlock,
    UserMessage,
)
from aap_server.runtime.checks import GuardianChecks
from aap_server.runtime.errors import InvalidRequestError
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, content_to_parts, parts_to_blocks, simplify
from aap_server.runtime.views import none_view
from aap_server.store import StepWrite

if TYPE_CHECKING:
    from aap_server.runtime.service import AapService
    from aap_server.runtime.turn import TurnRun


class TriggerDeniedError(InvalidRequestError):
    """The guardian refused the trigger or the message that carried it: nothing ran."""

    code = "trigger_denied"


@dataclass(frozen=True)
class Trigger:
    """What started a turn: an event (`event_type`, `event_id`) with `text` for the agent.

    `inbound` is the protocol message that carried it (e.g. an A2A `message/send`), checked
    before the trigger; `read_inbound` reads the text back out of a modified one."""

    event_type: str
    event_id: str
    text: str
    protocol: str = "A2A"
    inbound: dict[str, Any] | None = None
    read_inbound: Callable[[dict[str, Any]], str] | None = None
    metadata: dict[str, Any] | None = None


async def admit_trigger(run: TurnRun, trigger: Trigger) -> None:
    """Guard the trigger of a prepared turn; a modify replaces the turn's input. Call before
    `run.start()`, holding the session's turn lock."""
    text = trigger.text
    if trigger.inbound is not None:
        try:
            effective = await run.resources.guard_protocol(
                trigger.protocol, trigger.inbound, "inbound"
            )
            if effective is not trigger.inbound and trigger.read_inbound is not None:
                text = trigger.read_inbound(effective)  # StepDeniedError if unreadable
        except StepDeniedError as denied:
            await run.flush_audit()
            raise TriggerDeniedError(f"message: refused by the guardian: {denied.reason}") from None
    request = run.steps.agent_trigger(
        aos.AgentTrigger(
            type="autonomous",
            event=aos.AgentTriggerEvent(type=trigger.event_type, id=trigger.event_id),
            content=content_to_parts(text),
            metadata=trigger.metadata,
        )
    )
    verdict = await run.checks.check(request)
    if verdict.decision == "deny":
        await run.flush_audit()
        raise TriggerDeniedError(f"trigger: refused by the guardian: {verdict.message}")
    modified = verdict.modified_request
    if verdict.decision == "modify" and isinstance(modified, aos.AgentTriggerStep):
        content = simplify(parts_to_blocks(modified.params.trigger.content))
        run.messages = [UserMessage(content=content)]
    elif text != trigger.text:
        run.messages = [UserMessage(content=text)]


@dataclass(frozen=True)
class TriggeredReply:
    session_id: str
    turn_id: str
    stop_reason: StopReason
    text: str


async def run_triggered_turn(
    service: AapService,
    principal: Principal,
    agent: str,
    trigger: Trigger,
    session_id: str | None = None,
) -> TriggeredReply:
    """One turn of `agent` started by `trigger`, in `session_id` when it is the caller's
    session of that agent (a conversation continued), else in a new session."""
    record = await service.store.get_session(session_id, principal.owner) if session_id else None
    if record is None or record.agent.name != agent:
        created = await service.create_session(
            principal, PostSessionsRequest(agent=AgentConfig(name=agent))
        )
        session_id = created.session_id
    else:
        session_id = record.session_id
    request = PostSessionTurnRequest(messages=[UserMessage(content=trigger.text)], stream="none")
    turn = await service.start_turn(principal, session_id, request, trigger=trigger)
    response = await none_view(turn.events())
    texts: list[str] = []
    for message in response.messages:
        if isinstance(message, AssistantMessage):
            content = message.content
            if isinstance(content, str):
                texts.append(content)
            else:
                texts.extend(b.text for b in content if isinstance(b, TextContentBlock))
    return TriggeredReply(session_id, turn.turn_id, response.stop_reason, "\n".join(texts))


async def guard_reply(
    service: AapService, reply: TriggeredReply, message: dict[str, Any]
) -> dict[str, Any]:
    """The A2A reply to a triggered turn, checked as an outbound `protocols/A2A` message (on
    the session's audit trail); a deny raises `TriggerDeniedError`."""
    checks = GuardianChecks(service.guardian, reply.session_id, reply.turn_id)
    verdict = await checks.check(StepFactory.a2a(message, "outbound"))
    await service.store.commit(reply.session_id, StepWrite(audit=checks.take_audit()))
    if verdict.decision == "deny":
        raise TriggerDeniedError(f"reply: withheld by the guardian: {verdict.message}")
    modified = verdict.modified_request
    if verdict.decision == "modify" and isinstance(modified, aos.A2aMessage):
        return modified.params.effective_message
    return message
