"""Client input that is not a turn's message, guarded: a new session's seed history, and the
option values and tool definitions a client declares (the model reads them all)."""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from aap_server import aos
from aap_server.agent import text_of
from aap_server.guardian import FailClosed
from aap_server.ids import new_id
from aap_server.protocol import (
    AgentConfig,
    AssistantMessage,
    Content,
    ContentBlock,
    HistoryMessage,
    SystemMessage,
    TextContentBlock,
    ToolMessage,
    ToolSpec,
)
from aap_server.runtime.checks import (
    GuardianChecks,
    modified_content,
    modified_result,
    refuses_input,
    step_factory,
)
from aap_server.runtime.errors import InvalidRequestError
from aap_server.runtime.principal import Principal
from aap_server.runtime.registry import HostedAgent
from aap_server.runtime.steps import StepFactory
from aap_server.store import AuditDraft

logger = logging.getLogger("aap_server.turn")


async def guard_new_session(
    *,
    hosted: HostedAgent,
    guardian: FailClosed,
    principal: Principal,
    session_id: str,
    agent_config: AgentConfig,
    client_tools: list[ToolSpec] | None,
    seed: list[HistoryMessage],
    refuse_modified_input: bool = False,
) -> tuple[list[HistoryMessage], list[AuditDraft]]:
    """Guard a new session's client input: its options and tool definitions
    (`guard_client_config`), then its seed history (POST /sessions `messages`) message by
    message as the step table guards a turn. Returns the seed as the model may read it (the
    client's own stays in `full`) and the verdicts for the audit trail.

    User and system messages are `steps/message` role user (the client wrote them; AOS has a
    system role, but policies written for client input match `user`), assistant messages role
    agent, tool results `steps/toolCallResult` (the model reads them as tool output, so they
    get the check untrusted content gets). A denial refuses the session, naming the message:
    nothing is stored yet, so the client can fix its request, where a withheld notice would
    store history the client never wrote. With `refuse_modified_input` a modification
    refuses too."""
    steps = step_factory(
        hosted.tool_set(agent_config.tools, client_tools),
        session_id=session_id,
        turn_id=new_id("seed_"),  # the seed is no turn; its verdicts read as such in the audit
        principal=principal,
    )
    checks = GuardianChecks(guardian, session_id, steps.turn_id)
    await guard_client_config(
        checks, steps, agent_config.options, hosted.secret_options, client_tools
    )
    guarded: list[HistoryMessage] = []
    for index, message in enumerate(seed):
        request: aos.AosRequest
        if isinstance(message, ToolMessage):
            request = steps.tool_call_result(message.tool_call_id, message.content, False)
        else:
            role = "agent" if isinstance(message, AssistantMessage) else "user"
            request = steps.message(role, message.content)
        verdict = await checks.check(request)
        if refuses_input(verdict, refuse_modified_input):
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


def _lines(value: Any, label: str) -> list[str]:
    """Every key and leaf of a JSON value as a `key: leaf` (or `key:`) line, so a guardian
    reads each as plain text, unescaped. Linear in the value's size and iterative: a schema
    nested as deep as the JSON decoder allows costs no recursion and no long paths."""
    lines: list[str] = []
    stack: list[tuple[Any, str]] = [(value, label)]
    while stack:
        item, key = stack.pop()
        if isinstance(item, dict | list) and item:
            lines.append(f"{key}:")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((child, str(name)) for name, child in reversed(list(pairs)))
        else:
            lines.append(f"{key}: {item}")
    return lines


def client_config_content(
    options: dict[str, str] | None, secret_names: frozenset[str], tools: list[ToolSpec] | None
) -> list[ContentBlock]:
    """What a client declares that the model reads, as user content: option values (not the
    secret ones: those are credentials for the agent's code, and never go into an AOS
    payload) and client tool definitions (name, description, parameter schema, keys too)."""
    blocks: list[ContentBlock] = [
        TextContentBlock(text=f"agent.options.{key}: {value}")
        for key, value in (options or {}).items()
        if key not in secret_names
    ]
    for index, tool in enumerate(tools or []):
        lines = _lines(msgspec.to_builtins(tool), f"tools[{index}]")
        blocks.append(TextContentBlock(text="\n".join(lines)))
    return blocks


async def guard_client_config(
    checks: GuardianChecks,
    steps: StepFactory,
    options: dict[str, str] | None,
    secret_names: frozenset[str],
    tools: list[ToolSpec] | None,
) -> None:
    """Check client-declared options and tool definitions as a `steps/message` role user. A
    denial refuses the request (400, nothing stored); so does a modification, since a tool
    schema or an option rewritten by a guardian is no longer what the client declared."""
    content = client_config_content(options, secret_names, tools)
    if not content:
        return
    verdict = await checks.check(steps.message("user", content))
    if verdict.decision != "allow":
        raise InvalidRequestError(
            f"agent.options / tools: refused by policy: {verdict.message}",
            code="message_refused",
        )
