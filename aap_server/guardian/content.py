"""What a policy looks at in a step: who, which tool, which arguments, and its text — and how
to rewrite that text (for `modify`) without touching anything else of the request."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import msgspec

from aap_server import aos

# Where each method keeps the content a policy inspects and may rewrite (paths into the
# request's JSON form; `*` walks every item of a list, a trailing `**` every string below it,
# dictionary keys included). Every part kind is walked (text, file bytes/URI/name, data,
# metadata), not only text fields: whatever a step carries is seen.
CONTENT_PATHS: dict[str, list[tuple[str, ...]]] = {
    "steps/message": [
        ("params", "message", "content", "*", "**"),
        ("params", "message", "metadata", "**"),
    ],
    "steps/toolCallRequest": [("params", "toolCallRequest", "inputs", "*", "**")],
    "steps/toolCallResult": [("params", "result", "outputs", "*", "**")],
    "steps/knowledgeRetrieval": [("params", "knowledgeStep", "**")],
    "steps/memoryStore": [("params", "memory", "*")],
    "steps/memoryContextRetrieval": [("params", "memory", "*")],
    "steps/agentTrigger": [("params", "trigger", "**")],
    "protocols/MCP": [("params", "message", "**")],
    "protocols/A2A": [("params", "message", "**")],
    "ping": [],
}
# Dictionary keys that are plain identifiers of up to 15 characters (`kind`, `text`,
# `toolCallId`) are the structure of the JSON, not content: they are neither scanned nor
# rewritten. Every other key is, like every value and text, whatever its length or shape (a
# short value can be a whole secret or IBAN: `NO9386011117947`). The same holds for the
# values of the fields that name a part or an argument (`"kind": "text"`, an input's
# `"name": "subject"`): they are keys in all but form.
_NAMING_FIELDS = frozenset({"kind", "name"})
# A key of letters and `_` only, and short, names a field (`kind`, `text`, `to`) and is not
# scanned; any other key is content (an account or a number can stand as a key).
_PLAIN_NAME = re.compile(r"[A-Za-z_]{1,15}")

# Steps whose content comes from outside the agent's control.
# Content from outside the user and the agent's instructions. Recalled memory is among it: it
# holds what a model stored, maybe while fooled by an injection it read in an earlier turn.
UNTRUSTED_METHODS = frozenset(
    {
        "steps/toolCallResult",
        "steps/knowledgeRetrieval",
        "steps/memoryContextRetrieval",
        "protocols/MCP",
        "protocols/A2A",
    }
)


class StepView(msgspec.Struct, frozen=True, kw_only=True):
    """The facts of one step a rule can match on."""

    method: str
    agent: str | None
    session_id: str | None
    turn_id: str | None
    role: str | None
    tool: str | None
    execution_id: str | None
    arguments: dict[str, Any]
    texts: list[str]


def _walk(node: Any, path: tuple[str, ...], visit: Callable[[str], str]) -> Any:
    """Apply `visit` to every string at `path` under `node`; returns the rewritten node."""
    if not path:
        return visit(node) if isinstance(node, str) else node
    head, rest = path[0], path[1:]
    if head == "**":
        return _walk_all(node, visit)
    if head == "*":
        return [_walk(item, rest, visit) for item in node] if isinstance(node, list) else node
    if isinstance(node, dict) and head in node:
        return {**node, head: _walk(node[head], rest, visit)}
    return node


def _walk_all(node: Any, visit: Callable[[str], str]) -> Any:
    """Apply `visit` to every string and number under `node` (dictionary keys included), in
    document order; returns the rewritten copy. Iterative: content nested thousands deep is
    walked like any other (no recursion limit to hit)."""
    result: list[Any] = [None]
    # (container to fill, slot in it, source item, whether `slot` is a dictionary key still
    # to be visited); popped in document order, each container before its children.
    stack: list[tuple[Any, Any, Any, bool]] = [(result, 0, node, False)]
    while stack:
        target, slot, item, keyed = stack.pop()
        if keyed:
            slot = _key(slot, visit)
        if isinstance(item, str):
            naming = keyed and slot in _NAMING_FIELDS and _plain(item)
            target[slot] = item if naming else visit(item)
        elif isinstance(item, list):
            copy: list[Any] = [None] * len(item)
            target[slot] = copy
            stack.extend((copy, i, item[i], False) for i in range(len(item) - 1, -1, -1))
        elif isinstance(item, dict):
            mapping: dict[Any, Any] = {}
            target[slot] = mapping
            stack.extend((mapping, k, v, True) for k, v in reversed(item.items()))
        elif type(item) is int or type(item) is float:
            # A number is read as its digits (a card sent as a JSON number is still a card);
            # one the visit changes (redacts) becomes the changed text.
            # (a whole float as an integer: `4111111111111111.0` is how JSON writers and
            # dataframes hold a card number)
            whole = type(item) is float and item.is_integer()
            digits = repr(int(item)) if whole else repr(item)
            changed = visit(digits)
            target[slot] = item if changed == digits else changed
        else:
            target[slot] = item
    return result[0]


def _key(key: Any, visit: Callable[[str], str]) -> Any:
    if not isinstance(key, str) or _plain(key):
        return key
    return visit(key)


@functools.lru_cache(maxsize=1024)
def _plain(name: str) -> bool:
    """Whether a dictionary key is a plain name (keys repeat: `kind`, `text`, ... are looked
    up)."""
    return _PLAIN_NAME.fullmatch(name) is not None


def _normalized(request: aos.AosRequest) -> aos.AosRequest:
    """The prose form of requests that also accept the schema's form (DESIGN spec notes)."""
    params = request.params
    if isinstance(params, aos.ToolCallResultParams | aos.MessageParams | aos.ProtocolMessageParams):
        return msgspec.structs.replace(request, params=params.normalized())
    return request


class ViewTooLarge(Exception):
    """The step has more strings than the caller wanted to walk here (`view_of`)."""


def _texts(normalized: aos.AosRequest, max_strings: int | None = None) -> list[str]:
    """Every string of a normalized request's content, in order (`ViewTooLarge` past
    `max_strings` strings walked)."""
    found: list[str] = []
    walked = 0

    def collect(text: str) -> str:
        nonlocal walked
        walked += 1
        if max_strings is not None and walked > max_strings:
            raise ViewTooLarge
        found.append(text)
        return text

    # Every content path is under `params`: only they are converted (not the step's context,
    # with the agent's instructions and tools, which no path reads).
    document = {"params": msgspec.to_builtins(normalized.params)}
    for path in CONTENT_PATHS[normalized.method]:
        _walk(document, path, collect)
    return found


def rewrite(request: aos.AosRequest, change: Callable[[str], str]) -> aos.AosRequest:
    """The request with `change` applied to every string of its content, all else kept."""
    document = msgspec.to_builtins(_normalized(request))
    for path in CONTENT_PATHS[request.method]:
        document = _walk(document, path, change)
    rewritten: aos.AosRequest = msgspec.convert(document, type(request))
    return rewritten


def _plain_texts(params: Any) -> list[str] | None:
    """The texts `_texts` finds in the commonest steps, read straight from the structs: a
    message or tool result of text parts without metadata, a tool call whose arguments are
    strings under plain names. None for any other step (then the request is walked)."""
    if isinstance(params, aos.MessageParams):
        message = params.message
        parts: list[Any] = message.content
        if message.metadata:
            return None
    elif isinstance(params, aos.ToolCallResultParams):
        parts = params.effective_result.outputs
    elif isinstance(params, aos.ToolCallRequestParams):
        texts = []
        for argument in params.tool_call_request.inputs:
            value = argument.value
            if type(value) is not str or argument.id is not None or not _plain(argument.name):
                return None
            texts.append(value)
        return texts
    else:
        return None
    return _part_texts(parts)


def _part_texts(parts: list[Any]) -> list[str] | None:
    """The texts of parts that are all text parts without metadata; else None."""
    # Each part's `kind` is a naming field and a text part's only other string is its text.
    texts = []
    for part in parts:
        if type(part) is not aos.TextPart or part.metadata is not None:
            return None
        texts.append(part.text)
    return texts


def view_of(request: aos.AosRequest, *, max_strings: int | None = None) -> StepView:
    """What rules match on; `ViewTooLarge` once more than `max_strings` strings were walked
    (the caller then builds the view in a worker)."""
    params: Any = request.params
    if isinstance(params, aos.MessageParams):  # (the commonest step, read straight off)
        message = params.message
        texts = None if message.metadata else _part_texts(message.content)
        if texts is not None and (max_strings is None or len(texts) <= max_strings):
            context: aos.StepContext | None = params.context
            return StepView(
                method=request.method,
                agent=context.agent.name if context else None,
                session_id=context.session.id if context else None,
                turn_id=context.turn_id if context else None,
                role=message.role,
                tool=None,
                execution_id=None,
                arguments={},
                texts=texts,
            )
    return _general_view(request, max_strings)


def _general_view(request: aos.AosRequest, max_strings: int | None) -> StepView:
    """`view_of` of any step, the way that reads every method (a plain message is read
    straight off in `view_of`, to the same view)."""
    params: Any = request.params
    texts = _plain_texts(params)
    if texts is not None:
        if max_strings is not None and len(texts) > max_strings:
            raise ViewTooLarge
        normalized = request
    else:
        normalized = _normalized(request)
    params = normalized.params
    context = getattr(params, "context", None)
    role = tool = execution_id = None
    arguments: dict[str, Any] = {}
    if isinstance(params, aos.MessageParams):
        role = params.message.role
    elif isinstance(params, aos.ToolCallRequestParams):
        tool = params.tool_call_request.tool_id
        execution_id = params.tool_call_request.execution_id
        arguments = {arg.name: arg.value for arg in params.tool_call_request.inputs}
    elif isinstance(params, aos.ToolCallResultParams):
        execution_id = params.effective_execution_id
    return StepView(
        method=request.method,
        agent=context.agent.name if context else None,
        session_id=context.session.id if context else None,
        turn_id=context.turn_id if context else None,
        role=role,
        tool=tool,
        execution_id=execution_id,
        arguments=arguments,
        texts=_texts(normalized, max_strings) if texts is None else texts,
    )
