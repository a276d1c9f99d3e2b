"""Running server tools: each with its timeout, failures as error results, results guarded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from aap_server.agent import ServerTool, StepDeniedError, ToolContext, ToolError
from aap_server.protocol import Content, ToolMessage
from aap_server.runtime.checks import GuardianChecks, modified_result
from aap_server.runtime.steps import StepFactory
from aap_server.store import PendingToolCall

logger = logging.getLogger("aap_server.turn")

WITHHELD = "Tool result withheld by policy"
# The result of a granted or trusted call whose run was cut short (turn timeout, shutdown,
# crash): the tool may or may not have acted, and the model and the client are told so.
INTERRUPTED = "Error: the tool's run was interrupted; it may or may not have taken effect"


def close_interrupted(
    pending: list[PendingToolCall],
) -> tuple[list[ToolMessage], list[PendingToolCall]] | None:
    """For calls a crash left marked running: their error results, and the pending calls with
    them answered (a resubmitted grant then changes nothing). None when nothing was cut short."""
    running = [call for call in pending if call.resolution == "running"]
    if not running:
        return None
    results = [ToolMessage(tool_call_id=call.tool_call_id, content=INTERRUPTED) for call in running]
    answered = [
        msgspec.structs.replace(call, resolution="granted")
        if call.resolution == "running"
        else call
        for call in pending
    ]
    return results, answered


class ToolRunner:
    """Runs one turn's server tool calls and guards what they return."""

    def __init__(
        self,
        tools: dict[str, ServerTool],
        context: ToolContext,
        checks: GuardianChecks,
        steps: StepFactory,
    ) -> None:
        self.tools = tools
        self.context = context
        self.checks = checks
        self.steps = steps

    async def run_all(
        self, calls: list[PendingToolCall], on_result: Callable[[ToolMessage], None]
    ) -> None:
        """Run the calls concurrently; `on_result` hears of each result as it is ready."""

        async def run_one(call: PendingToolCall) -> None:
            content, is_error = await self.execute(call)
            content = await self.guard_result(call.tool_call_id, content, is_error)
            on_result(ToolMessage(tool_call_id=call.tool_call_id, content=content))

        async with asyncio.TaskGroup() as group:
            for call in calls:
                group.create_task(run_one(call))

    async def execute(self, call: PendingToolCall) -> tuple[Content, bool]:
        tool = self.tools[call.name]
        timeout = tool.timeout_seconds
        try:
            async with asyncio.timeout(timeout):
                return await tool.run(call.input, self.context), False
        except TimeoutError:
            return f"Error: tool {call.name!r} timed out after {timeout:g} s", True
        except ToolError as error:
            return f"Error: {error}", True
        except StepDeniedError as denied:
            return f"Error: denied by policy: {denied.reason}", True
        except Exception:
            logger.exception("server tool %s failed", call.name)
            return f"Error: tool {call.name!r} failed", True

    async def guard_result(self, call_id: str, content: Content, is_error: bool) -> Content:
        verdict = await self.checks.check(self.steps.tool_call_result(call_id, content, is_error))
        if verdict.decision == "deny":
            return WITHHELD
        if verdict.decision == "modify":
            return modified_result(verdict, content)
        return content
