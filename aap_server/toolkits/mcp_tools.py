"""Server tools backed by MCP servers (stdio or streamable HTTP), through the official `mcp` SDK.

`McpToolset(spec)` is one MCP server for one process: it lists the server's tools once at
start and pins each tool by the sha256 of its name, description and input schema. What the
server listed is untrusted text a model would read, so it is served only once the guardian has
screened it (`screen`, the agent's `DiscoveredTools`, which the server runs at start before
`/meta` or any model sees a tool): the list goes to the guardian as one inbound `tools/list`
answer (`protocols/MCP`); a modified list is what is served; a denied one is screened tool by
tool, each alone, and the tools the guardian lets through are screened again as one list (so
what is served is always a list the guardian let through as a whole). A denied tool is not
served (nor callable) and a warning names the server, the tool and the guardian's rule, never
the text. A guardian that fails denies (fail closed): its tools are not served.

The serving connection is opened lazily, by the first call, in the server's own event loop,
reused by every later call of every session, and closed by `aclose()` (the server calls it at
shutdown through `Agent.close_hooks`).

Every MCP message of a call goes through the turn's guardian as `protocols/MCP`
(`ToolContext.mcp_send` before it is sent, `ToolContext.mcp_receive` before it is used), as
`specs/aos/extend_mcp.md` says: a denied request is not sent, a denied answer is not used, a
modified one is sent or used as modified. Before a connection's first call its `tools/list`
(the served tools: the others are not used) is compared with the pins: the tools whose
description or schema changed since they were first seen (a "rug pull") are named in the
answer's `_meta["aap-server/pinChanged"]` (the answer is the tools alone: a server's own
`_meta` is not passed on), which the policy guardian reports as the finding
`mcp.tool_changed`. The guardian decides: a denied list is not used (the call fails with the
guardian's reason, and the changed tools are withheld from the model, `withheld`, until a later
list is allowed); an allowed one lets the changed tools be called (the model still reads the
description screened at start). A server's `notifications/tools/list_changed` makes the next
call list and compare again.

The guardian sees the JSON-RPC messages as the SDK sends them (method and params, and the
result as the server returned it); the `id` is this toolset's own counter. The connection's
`initialize` handshake is shown to the guardian as well (deny enforced; the SDK owns its
content, so a modification of it is not applied). The listing at start is not: it runs before
the guardian is at hand, carries no user's data, and what it brings back is screened.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import msgspec

from aap_server.agent import (
    DiscoveredTools,
    ServerTool,
    StartGuard,
    StepDeniedError,
    ToolContext,
    ToolError,
)

__all__ = ["PIN_CHANGED", "McpServerSpec", "McpTool", "McpToolset", "tool_pin"]

logger = logging.getLogger("aap_server.mcp")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")  # an RFC 9110 token
# The separator between a server's name and its tool's in the agent's tool names.
SEPARATOR = "__"
# OpenAI-compatible endpoints accept tool names of at most 64 characters.
MAX_TOOL_NAME = 64
# The `_meta` key of a `tools/list` answer (as the guardian is shown it) naming the tools that
# changed since they were pinned: the policy guardian's `MCP_PIN_CHANGED`.
PIN_CHANGED = "aap-server/pinChanged"


class McpServerSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One MCP server of an agent (`mcp_servers = [{...}]`): a command to run (stdio) or the
    URL of a streamable HTTP endpoint. Its tools become the agent's `<name>__<tool>`."""

    name: str
    command: str = ""
    args: list[str] = msgspec.field(default_factory=list)
    # Extra environment variables for the command (merged over a minimal safe environment).
    env: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    # HTTP headers sent to `url` (e.g. `Authorization`): values given here, or the names of
    # environment variables holding them (`headers_env`, read at start). Never printed.
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    headers_env: dict[str, str] = msgspec.field(default_factory=dict)
    # Serve only these of the server's tools (default: all).
    tools: list[str] | None = None
    # Whether clients see the tools in /meta and enable them per session (else always on).
    exposed: bool = True
    connect_timeout_seconds: float = 30.0
    call_timeout_seconds: float = 60.0
    max_tools: int = 64

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(
                "name: 1-32 letters, digits, '_' or '-', starting with a letter or digit"
            )
        if bool(self.command) == bool(self.url):
            raise ValueError("set command (a stdio server) or url (streamable HTTP), not both")
        if self.url and not re.match(r"https?://[^/\s]+", self.url):
            raise ValueError("url: must be an http:// or https:// URL")
        for field_name in ("connect_timeout_seconds", "call_timeout_seconds"):
            if not getattr(self, field_name) > 0:
                raise ValueError(f"{field_name}: must be positive")
        if not 1 <= self.max_tools <= 1024:
            raise ValueError("max_tools: must be within 1..1024")
        if (self.headers or self.headers_env) and not self.url:
            raise ValueError("headers: only a url (streamable HTTP) server takes headers")
        for header in [*self.headers, *self.headers_env]:
            if not _HEADER.fullmatch(header):
                raise ValueError(f"headers: {header!r} is not an HTTP header name")
        for header, value in self.headers.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"headers: the value of {header!r} may not hold a line break")
        both = sorted({h.lower() for h in self.headers} & {h.lower() for h in self.headers_env})
        if both:
            raise ValueError(f"headers: {both[0]!r} is in both headers and headers_env")

    def with_headers_from(self, environ: Mapping[str, str]) -> McpServerSpec:
        """The spec with `headers_env` read into `headers` (a ValueError naming the variable
        when one is not set)."""
        if not self.headers_env:
            return self
        headers = dict(self.headers)
        for header, variable in self.headers_env.items():
            value = environ.get(variable, "")
            if not value:
                raise ValueError(
                    f"mcp_servers ({self.name!r}): headers_env: environment variable "
                    f"{variable} is not set"
                )
            headers[header] = value
        return msgspec.structs.replace(self, headers=headers, headers_env={})

    def __repr__(self) -> str:  # env values may be secrets
        where = self.url or self.command
        return f"McpServerSpec(name={self.name!r}, {where!r})"

    __str__ = __repr__


class McpTool(msgspec.Struct, frozen=True, kw_only=True):
    """One tool as an MCP server lists it."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict, name="inputSchema")
    title: str | None = None


def tool_pin(tool: McpTool) -> str:
    """The sha256 (hex) of what the model reads of a tool: name, description, input schema."""
    read = [tool.name, tool.description, tool.input_schema]
    canonical = msgspec.json.encode(read, order="sorted")
    return hashlib.sha256(canonical).hexdigest()


def _wire(tool: McpTool) -> dict[str, Any]:
    """A tool as an MCP server lists it (camelCase, no unset title)."""
    listed: dict[str, Any] = msgspec.to_builtins(tool)
    if listed.get("title") is None:
        listed.pop("title", None)
    return listed


def _listed(result: dict[str, Any]) -> list[McpTool]:
    """The tools of a `tools/list` result (raises ToolError when it is not one)."""
    try:
        return msgspec.convert(result.get("tools", []), list[McpTool], strict=False)
    except msgspec.ValidationError as error:
        raise ToolError(f"the MCP server's tools/list answer is malformed: {error}") from error


class _Connection:
    """One live session with the server, owned by a background task: the SDK's transports are
    context managers that must be entered and left by the same task."""

    def __init__(self, spec: McpServerSpec, on_list_changed: Callable[[], None]) -> None:
        self.spec = spec
        self._on_list_changed = on_list_changed
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def open(self) -> tuple[Any, dict[str, Any]]:
        """The initialized session and the server's `initialize` result."""
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._own(ready), name=f"mcp:{self.spec.name}")
        # Shielded: a call that times out while connecting leaves the connection to finish.
        async with asyncio.timeout(self.spec.connect_timeout_seconds):
            opened: tuple[Any, dict[str, Any]] = await asyncio.shield(ready)
            return opened

    async def _handle(self, message: Any) -> None:
        method = getattr(getattr(message, "root", message), "method", None)
        if method == "notifications/tools/list_changed":
            self._on_list_changed()

    async def _own(self, ready: asyncio.Future[Any]) -> None:
        from mcp import ClientSession  # the SDK is imported only by agents that use MCP

        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(_transport(self.spec))
                session = await stack.enter_async_context(
                    ClientSession(
                        streams[0],
                        streams[1],
                        read_timeout_seconds=self.spec.call_timeout_seconds,
                        message_handler=self._handle,
                        client_info=_client_info(),
                    )
                )
                initialized = _dump(await session.initialize())
                ready.set_result((session, initialized))
                await self._stop.wait()
        except Exception as error:
            if not ready.done():
                ready.set_exception(error)
            else:
                logger.warning("MCP server %r: connection lost: %r", self.spec.name, error)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                async with asyncio.timeout(self.spec.connect_timeout_seconds):
                    await self._task
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task


CLIENT_INFO = {"name": "aap-server", "version": "1"}


def _client_info() -> Any:
    from mcp.types import Implementation

    return Implementation(name=CLIENT_INFO["name"], version=CLIENT_INFO["version"])


def _transport(spec: McpServerSpec) -> contextlib.AbstractAsyncContextManager[Any]:
    if spec.url and spec.headers:
        return _http_with_headers(spec.url, spec.headers)
    if spec.url:
        from mcp.client.streamable_http import streamable_http_client

        return streamable_http_client(spec.url)
    from mcp import StdioServerParameters, stdio_client

    parameters = StdioServerParameters(
        command=spec.command, args=list(spec.args), env=dict(spec.env) or None, cwd=spec.cwd
    )
    return stdio_client(parameters, errlog=sys.stderr)


@contextlib.asynccontextmanager
async def _http_with_headers(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """The streamable HTTP transport with an HTTP client of the SDK's defaults that sends
    `headers` (closed with the transport)."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client  # the SDK's default client

    async with (
        create_mcp_http_client(headers=headers) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams


def _dump(model: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


async def _list_all(session: Any, max_tools: int, server: str) -> dict[str, Any]:
    """Every page of `tools/list`, as one result."""
    from mcp.types import PaginatedRequestParams

    tools: list[Any] = []
    cursor: str | None = None
    while True:
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        page = _dump(await session.list_tools(params=params))
        tools.extend(page.get("tools", []))
        if len(tools) > max_tools:
            raise ToolError(
                f"MCP server {server!r} lists more than max_tools = {max_tools} tools; "
                "raise max_tools or pick some with tools = [...]"
            )
        cursor = page.get("nextCursor")
        if not cursor:
            return {"tools": tools}


class McpToolset(DiscoveredTools):
    """The tools of one MCP server as server tools (see the module docstring)."""

    def __init__(self, spec: McpServerSpec, *, discover: bool = True) -> None:
        self.spec = spec
        self._connection: _Connection | None = None
        self._lock = asyncio.Lock()
        # Pins of the tools this server was first seen with: tool name -> sha256.
        self.pins: dict[str, str] = {}
        # Whether the live connection's tool list was screened and compared with the pins
        # (cleared on connect and when the server says its list changed).
        self._verified = False
        # Tools whose changed listing the guardian denied: not offered to the model.
        self._refused: set[str] = set()
        self._message_id = 0
        # The server's tools (those the spec selects) as it listed them at start.
        self._discovered: list[dict[str, Any]] = []
        self._names: frozenset[str] = frozenset()
        # The tools served, as the guardian let them through at start (none until screened).
        self.listed: list[McpTool] = []
        self._live: Any = None
        if discover:
            self.pin(self.discover())

    # --- start ------------------------------------------------------------------------------

    def discover(self) -> list[dict[str, Any]]:
        """The server's tools as it lists them, listed once over a short-lived connection (in a
        thread with its own event loop, so it works whether or not the caller runs one). Raises
        ValueError naming the server when it cannot be reached or lists too many tools."""
        outcome: list[Any] = []

        async def list_once() -> None:
            from mcp import ClientSession

            async with (
                asyncio.timeout(self.spec.connect_timeout_seconds),
                _transport(self.spec) as streams,
                ClientSession(streams[0], streams[1]) as session,
            ):
                await session.initialize()
                outcome.append(await _list_all(session, self.spec.max_tools, self.spec.name))

        def run() -> None:
            try:
                asyncio.run(list_once())
            except BaseException as error:  # reported to the caller's thread below
                outcome.append(error)

        thread = threading.Thread(target=run, name=f"mcp-discover:{self.spec.name}")
        thread.start()
        thread.join()
        result = outcome[-1] if outcome else None
        if not isinstance(result, dict):
            raise ValueError(
                f"mcp_servers ({self.spec.name!r}): cannot list its tools: {result!r}"
            ) from (result if isinstance(result, BaseException) else None)
        tools: list[dict[str, Any]] = result.get("tools", [])
        return tools

    def pin(self, listed: list[dict[str, Any]]) -> None:
        """Pin these tools (those the spec selects, as the server listed them) as first seen.
        None is served until `screen`."""
        try:
            tools = _listed({"tools": listed})
        except ToolError as error:
            raise ValueError(f"mcp_servers ({self.spec.name!r}): {error}") from error
        wanted = self.spec.tools
        if wanted is not None:
            missing = sorted(set(wanted) - {tool.name for tool in tools})
            if missing:
                raise ValueError(
                    f"mcp_servers ({self.spec.name!r}): tools: the server has no tool "
                    f"{', '.join(map(repr, missing))}"
                )
        picked = [i for i, tool in enumerate(tools) if wanted is None or tool.name in wanted]
        self._discovered = [listed[i] for i in picked]
        self.pins = {tools[i].name: tool_pin(tools[i]) for i in picked}
        self._names = frozenset(self._agent_name(tools[i].name) for i in picked)
        self.listed = []

    @property
    def names(self) -> frozenset[str]:
        """The agent's names (`<server>__<tool>`) of every tool pinned, served or not."""
        return self._names

    def _agent_name(self, tool: str) -> str:
        name = f"{self.spec.name}{SEPARATOR}{tool}"
        if len(name) > MAX_TOOL_NAME or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ValueError(
                f"mcp_servers ({self.spec.name!r}): tool {tool!r} gives the name {name!r}, "
                f"which is not 1-{MAX_TOOL_NAME} letters, digits, '_' or '-'"
            )
        return name

    async def screen(self, guard: StartGuard) -> list[ServerTool]:
        """Screen the tools listed at start through the guardian (see the module docstring)
        and serve those it lets through; returns them as server tools."""
        served = await self._screened(guard, self._discovered)
        if served is None and len(self._discovered) > 1:
            alone: list[McpTool] = []
            for listed in self._discovered:
                alone += await self._screened(guard, [listed]) or []
            served = alone
            if len(alone) > 1:  # what is served is a list the guardian let through as a whole
                served = await self._screened(guard, [_wire(tool) for tool in alone])
                if served is None:
                    for tool in alone:
                        self._withhold(tool.name, "denied with the others as one list")
        self.listed = served or []
        return self.tools

    async def _screened(
        self, guard: StartGuard, listed: list[dict[str, Any]]
    ) -> list[McpTool] | None:
        """These tools as one inbound `tools/list` answer through the guardian: the tools it
        lets through, as it lets them through (a modified answer can drop or change tools of
        this list, not add any), or None when it denies the answer (the tools, if one, are
        logged as withheld)."""
        names = [str(tool.get("name")) for tool in listed]
        answer = {"jsonrpc": "2.0", "id": self._next_id(), "result": {"tools": listed}}
        try:
            used = await guard.mcp_receive(answer)
        except StepDeniedError as error:
            if len(listed) == 1:
                self._withhold(names[0], error.reason)
            else:
                logger.warning(
                    "MCP server %r: the guardian denied its tool list at start (%s); screening "
                    "each tool alone",
                    self.spec.name,
                    error.reason,
                )
            return None
        result = used.get("result")
        try:
            tools = _listed(result if isinstance(result, dict) else {"tools": None})
        except ToolError:
            for name in names:
                self._withhold(name, "the guardian's modified tool list is malformed")
            return None
        kept: dict[str, McpTool] = {}
        for tool in tools:
            if tool.name in names and tool.name not in kept:
                kept[tool.name] = tool
        for name in names:
            if name not in kept:
                self._withhold(name, "the guardian's modified tool list leaves it out")
        return list(kept.values())

    def _withhold(self, tool: str, why: str) -> None:
        logger.warning(
            "MCP server %r: tool %r is withheld (not offered to the model nor shown in /meta): %s",
            self.spec.name,
            tool,
            why,
        )

    @property
    def withheld(self) -> frozenset[str]:
        """The agent's names (`<server>__<tool>`) of tools changed since they were pinned whose
        listing the guardian denied: the model is not offered them."""
        return frozenset(f"{self.spec.name}{SEPARATOR}{name}" for name in self._refused)

    @property
    def tools(self) -> list[ServerTool]:
        """The served tools as the agent's server tools, named `<server>__<tool>`."""
        return [self._server_tool(tool) for tool in self.listed]

    def _server_tool(self, tool: McpTool) -> ServerTool:
        name = self._agent_name(tool.name)
        schema = tool.input_schema or {"type": "object", "properties": {}}

        async def run(arguments: dict[str, Any], context: ToolContext) -> str:
            return await self.call(tool.name, arguments, context)

        return ServerTool(
            name=name,
            title=tool.title,
            description=tool.description,
            parameters=schema,
            run=run,
            exposed=self.spec.exposed,
            timeout_seconds=self.spec.connect_timeout_seconds + self.spec.call_timeout_seconds,
        )

    # --- calls ------------------------------------------------------------------------------

    def _next_id(self) -> int:
        self._message_id += 1
        return self._message_id

    def _list_changed(self) -> None:
        self._verified = False

    async def _session(self, context: ToolContext) -> Any:
        """The live session, opened (and its tool list screened and compared) if need be."""
        async with self._lock:
            connection = self._connection
            if connection is None or not connection.alive:
                await self._connect(context)
            if not self._verified:
                await self._verify(self._live, context)
            return self._live

    async def _connect(self, context: ToolContext) -> None:
        """Open the serving connection; its `initialize` handshake goes through the guardian
        too (a denied request: not connected; a denied answer: disconnected). The SDK sends the
        handshake itself, so a modification of it is not applied."""
        request: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": self._next_id(),
            "method": "initialize",
            "params": {"clientInfo": CLIENT_INFO, "capabilities": {}},
        }
        await context.mcp_send(request)
        connection = _Connection(self.spec, self._list_changed)
        try:
            session, initialized = await connection.open()
        except Exception as error:
            await connection.close()
            logger.warning("MCP server %r: cannot connect: %r", self.spec.name, error)
            raise ToolError(f"MCP server {self.spec.name!r} is not reachable") from error
        try:
            await context.mcp_receive(
                {"jsonrpc": "2.0", "id": request["id"], "result": initialized}
            )
        except BaseException:
            await connection.close()
            raise
        self._connection, self._live, self._verified = connection, session, False

    async def _verify(self, session: Any, context: ToolContext) -> None:
        """List the tools through the guardian, the ones changed since they were pinned marked
        in the answer's `_meta`: a denied list leaves them refused (and the call fails)."""
        request = {"jsonrpc": "2.0", "id": self._next_id(), "method": "tools/list"}
        await context.mcp_send(request)
        listing = await _list_all(session, self.spec.max_tools, self.spec.name)
        # Only the served tools are used: the others' text reaches no model.
        served = {tool.name for tool in self.listed}
        listing["tools"] = [
            listed
            for listed in listing["tools"]
            if isinstance(listed, dict) and listed.get("name") in served
        ]
        seen = {tool.name: tool_pin(tool) for tool in _listed(listing)}
        # A tool the server no longer lists is not a change to guard: its calls fail there.
        changed = {
            name: seen[name]
            for name, pinned in self.pins.items()
            if name in seen and seen[name] != pinned
        }
        for name, now in changed.items():
            logger.warning(
                "MCP server %r: tool %r changed since it was pinned (sha256 %s -> %s)",
                self.spec.name,
                name,
                self.pins[name][:12],
                now[:12],
            )
        if changed:
            listing["_meta"] = {PIN_CHANGED: sorted(changed)}
        try:
            await context.mcp_receive({"jsonrpc": "2.0", "id": request["id"], "result": listing})
        except StepDeniedError:
            self._refused.update(changed)
            raise
        self._refused = set()
        self._verified = True

    async def call(self, tool: str, arguments: dict[str, Any], context: ToolContext) -> str:
        """Call one tool: the request and its answer each go through the guardian."""
        if all(served.name != tool for served in self.listed):
            raise ToolError(f"MCP tool {tool!r} of {self.spec.name!r} is not served")
        session = await self._session(context)
        request: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": self._next_id(),
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }
        allowed = await context.mcp_send(request)
        params = allowed.get("params")
        if not isinstance(params, dict) or params.get("name") != tool:
            raise StepDeniedError("the guardian's modified MCP request names another tool")
        call_arguments = params.get("arguments")
        if not isinstance(call_arguments, dict):
            call_arguments = {}
        try:
            result = _dump(await session.call_tool(tool, call_arguments))
        except Exception as error:
            logger.warning("MCP server %r: tools/call %r failed: %r", self.spec.name, tool, error)
            raise ToolError(f"MCP tool {tool!r} failed: {error}") from error
        answer = await context.mcp_receive(
            {"jsonrpc": "2.0", "id": request["id"], "result": result}
        )
        used = answer.get("result")
        if not isinstance(used, dict):
            raise ToolError(f"MCP tool {tool!r} gave no result")
        text = _text_of(used)
        if used.get("isError"):
            raise ToolError(text or f"MCP tool {tool!r} failed")
        return text

    async def aclose(self) -> None:
        """Close the live connection (and stop a stdio server's process)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()


def _text_of(result: dict[str, Any]) -> str:
    """The text a tool result gives the model: its text blocks, else its structured content."""
    pieces: list[str] = []
    for block in result.get("content") or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            pieces.append(block["text"])
        else:
            pieces.append(f"[{block.get('type', 'content')} {block.get('mimeType', '')}]".strip())
    if not pieces and result.get("structuredContent") is not None:
        pieces.append(msgspec.json.encode(result["structuredContent"]).decode())
    return "\n".join(pieces)
