"""A new session's seed history (POST /sessions `messages`), guarded as a turn's input is."""

from __future__ import annotations

import logging

import msgspec

from aap_server import aos
from aap_server.agent import text_of
from aap_server.guardian import FailClosed
from aap_server.ids import new_id
from aap_server.protocol import (
    AgentConfig,
    AssistantMessage,
    Content,
    HistoryMessage,
    SystemMessage,
    ToolMessage,
    ToolSpec,
)
from aap_server.runtime.checks import (
    GuardianChecks,
    modified_content,
    modified_result,
    step_factory,
)
from aap_server.runtime.errors import InvalidRequestError
from aap_server.runtime.principal import Principal
from aap_server.runtime.registry import HostedAgent
from aap_server.store import AuditDraft

logger = logging.getLogger("aap_server.turn")


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
    steps = step_factory(
        hosted,
        model_tools,
        frozenset(tool.name for tool in client_tools or []),
        session_id=session_id,
        turn_id=new_id("seed_"),  # the seed is no turn; its verdicts read as such in the audit
        principal=principal,
    )
    checks = GuardianChecks(guardian, session_id, steps.turn_id)
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
                content = modified_result(verdict, message.content)
            else:
                content = modified_content(verdict, message.content)
            if isinstance(message, SystemMessage):
                content = text_of(content)  # a system message holds plain text only
            message = msgspec.structs.replace(message, content=content)
        guarded.append(message)
    return guarded, checks.take_audit()
