"""Server tools a declared agent enables by name (`tools = ["current_time"]`).

Each runs through the turn engine like any server tool: the guardian checks the call and its
result, and the client enables it per session (with or without trust).
"""

from __future__ import annotations

import datetime
import zoneinfo
from typing import Any

from aap_server.agent import ServerTool, ToolContext, ToolError
from aap_server.toolkits.aom import AOM_INVOKE, AOM_READ_SURFACE

__all__ = ["BUILTIN_TOOLS", "CURRENT_TIME"]

MAX_TIMEZONE_CHARS = 64


async def _current_time(arguments: dict[str, Any], context: ToolContext) -> str:
    name = arguments.get("timezone") or "UTC"
    if not isinstance(name, str) or len(name) > MAX_TIMEZONE_CHARS:
        raise ToolError(
            f"'timezone' must be an IANA time zone name of at most {MAX_TIMEZONE_CHARS} characters"
        )
    try:
        zone = zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as error:
        raise ToolError(
            f"unknown time zone {name!r} (use an IANA name such as Europe/Paris)"
        ) from error
    now = datetime.datetime.now(zone)
    return f"{now.isoformat(timespec='seconds')} ({name})"


CURRENT_TIME = ServerTool(
    name="current_time",
    title="Current time",
    description="The current date and time, in ISO 8601, in a time zone (UTC by default).",
    parameters={
        "type": "object",
        "properties": {
            "timezone": {
                "type": "string",
                "description": "An IANA time zone name such as Europe/Paris; default UTC.",
            }
        },
        "additionalProperties": False,
    },
    run=_current_time,
)

# AOM surfaces: see toolkits/aom (the guardian enforces the surfaces' automation_policy).
BUILTIN_TOOLS: dict[str, ServerTool] = {
    tool.name: tool for tool in (CURRENT_TIME, AOM_READ_SURFACE, AOM_INVOKE)
}
