"""The demo agent's model: deterministic, offline, driven by commands in the user's message.

It reads the newest user message (text blocks joined by newlines, each image as a line
`[image]`) line by line. A line whose first word is a known command is a command; every other
line is plain text, echoed back as `Echo: <text>`:

    /tool NAME {JSON}  call a tool with that JSON object input (several lines: parallel calls)
    /think             stream a short thinking block first
    /sleep S           wait S seconds (clamped to 0..10) before answering
    /remember TEXT     ask the server to remember TEXT (a guarded memory step)
    /memories          list the memory recalled for this response
    /options           show the options (style, signature, whether an api_key is set)
    /long N            reply with N words (at most 5000) in many deltas
    /refuse            reply "I can't help with that." and stop with `refusal`
    /error             fail with RuntimeError("demo model failure") after the first delta
    /help              list these commands

When the history ends with tool results, it instead summarises the results of the last
assistant message's tool calls: `Tool results: calculator → 42; send_email → Queued …`.

Everything but the pure `respond` loop is a small pure function, unit-tested on its own.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aap_server.agent import (
    AssistantMessage,
    Content,
    HistoryMessage,
    ImageContentBlock,
    ModelOutput,
    ModelRequest,
    ModelStop,
    Remember,
    TextContentBlock,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolMessage,
    ToolUseContentBlock,
    TurnModel,
    UserMessage,
)

__all__ = [
    "MAX_LONG_WORDS",
    "MAX_RESULT_CHARS",
    "MAX_SLEEP_SECONDS",
    "REFUSAL",
    "WORDS_PER_DELTA",
    "DemoModel",
    "ParsedMessage",
    "Reply",
    "ToolLine",
    "chunk_text",
    "long_text",
    "message_text",
    "parse_long",
    "parse_message",
    "parse_sleep",
    "parse_tool_line",
    "plan_reply",
    "result_preview",
    "shape",
    "summarize_tool_results",
]

MAX_SLEEP_SECONDS = 10.0
MAX_LONG_WORDS = 5000
WORDS_PER_DELTA = 4
MAX_RESULT_CHARS = 200
REFUSAL = "I can't help with that."
PIRATE_PREFIX = "Arr! "
PIRATE_SUFFIX = " Yo-ho-ho!"
DENIED = "Tool call denied"

HELP = (
    "Commands (one per line; other lines are echoed):\n"
    "/tool NAME {JSON} · /think · /sleep S · /remember TEXT · /memories · /options · "
    "/long N · /refuse · /error · /help"
)

_LOREM_TEXT = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua"
)
_LOREM = _LOREM_TEXT.split()


# --- parsing the user's message -------------------------------------------------------------


@dataclass(frozen=True)
class ToolLine:
    """A `/tool NAME {JSON}` line."""

    name: str
    input: dict[str, Any]


@dataclass
class ParsedMessage:
    """What a user message asks for, line by line."""

    text_lines: list[str] = field(default_factory=list)
    calls: list[ToolLine] = field(default_factory=list)
    # One readable message per malformed command line.
    problems: list[str] = field(default_factory=list)
    remember: list[str] = field(default_factory=list)
    think: bool = False
    sleep: float = 0.0
    long_words: int | None = None
    memories: bool = False
    options: bool = False
    help: bool = False
    refuse: bool = False
    fail: bool = False

    @property
    def text(self) -> str:
        """The plain-text lines, joined, without surrounding blank space."""
        return "\n".join(self.text_lines).strip()


def message_text(content: Content) -> str:
    """The text of a user message: a string as is; text blocks joined by newlines, each
    image as a line `[image]` (other blocks ignored)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ImageContentBlock):
            parts.append("[image]")
    return "\n".join(parts)


def parse_tool_line(rest: str) -> ToolLine | str:
    """Parse what follows `/tool`: a name and a JSON object. A string is the error."""
    parts = rest.split(maxsplit=1)
    if not parts:
        return "expected /tool NAME {JSON object}"
    if len(parts) == 1:
        return "missing the JSON object input after the tool name"
    name, raw = parts
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as error:
        return f"invalid JSON ({error.msg} at column {error.colno})"
    if not isinstance(value, dict):
        return "the input must be a JSON object"
    return ToolLine(name=name, input=value)


def parse_sleep(argument: str) -> float | None:
    """Seconds to sleep, clamped to 0..MAX_SLEEP_SECONDS; None when not a number."""
    try:
        seconds = float(argument)
    except ValueError:
        return None
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_SLEEP_SECONDS)


def parse_long(argument: str) -> int | None:
    """A word count, capped at MAX_LONG_WORDS; None when not a non-negative integer."""
    try:
        count = int(argument)
    except ValueError:
        return None
    if count < 0:
        return None
    return min(count, MAX_LONG_WORDS)


_FLAGS = {
    "/think": "think",
    "/memories": "memories",
    "/options": "options",
    "/help": "help",
    "/refuse": "refuse",
    "/error": "fail",
}


def _apply_command(parsed: ParsedMessage, command: str, argument: str) -> str | None:
    """Record one command with an argument; the reason it is malformed, if it is."""
    if command == "/tool":
        call = parse_tool_line(argument)
        if isinstance(call, str):
            return call
        parsed.calls.append(call)
    elif command == "/sleep":
        seconds = parse_sleep(argument)
        if seconds is None:
            return "expected /sleep SECONDS"
        parsed.sleep = seconds
    elif command == "/long":
        count = parse_long(argument)
        if count is None:
            return "expected /long N, a whole number of words"
        parsed.long_words = count
    elif not argument:
        return "expected /remember TEXT"
    else:
        parsed.remember.append(argument)
    return None


def parse_message(text: str) -> ParsedMessage:
    """Split a message into commands and plain text (see the module docstring). Arguments
    after a flag command (/think, /refuse…) are ignored; unknown `/words` are plain text."""
    parsed = ParsedMessage()
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.strip().split(maxsplit=1)
        command = words[0] if words else ""
        argument = words[1].strip() if len(words) > 1 else ""
        if command in _FLAGS:
            setattr(parsed, _FLAGS[command], True)
            continue
        if command not in ("/tool", "/sleep", "/long", "/remember"):
            parsed.text_lines.append(line)
            continue
        error = _apply_command(parsed, command, argument)
        if error is not None:
            parsed.problems.append(f"Line {number} is malformed ({error}): {line.strip()}")
    return parsed


# --- shaping and streaming text ------------------------------------------------------------


def chunk_text(text: str, words: int = WORDS_PER_DELTA) -> list[str]:
    """Split text into pieces of `words` words that concatenate back to exactly `text`."""
    tokens = re.findall(r"\s*\S+\s*", text)
    if not tokens:
        return [text] if text else []
    return ["".join(tokens[i : i + words]) for i in range(0, len(tokens), words)]


def shape(text: str, options: dict[str, str]) -> str:
    """Apply the `style` option (plain, upper, pirate), then append the `signature`."""
    style = options.get("style", "plain")
    if style == "upper":
        text = text.upper()
    elif style == "pirate":
        text = f"{PIRATE_PREFIX}{text}{PIRATE_SUFFIX}"
    signature = options.get("signature", "").strip()
    if signature:
        text = f"{text}\n— {signature}"
    return text


def long_text(count: int) -> str:
    """`count` words of deterministic filler text."""
    return " ".join(_LOREM[i % len(_LOREM)] for i in range(count))


def _options_text(options: dict[str, str]) -> str:
    style = options.get("style", "plain")
    signature = options.get("signature", "") or "(none)"
    key = "set" if options.get("api_key") else "not set"
    return f"Options: style={style}; signature={signature}; api_key is {key}."


def _memories_text(memory: Sequence[str]) -> str:
    if not memory:
        return "I don't remember anything yet."
    return "I remember:\n" + "\n".join(f"- {item}" for item in memory)


def _unavailable_text(name: str, available: Sequence[str]) -> str:
    if not available:
        return f"Tool {name!r} is unavailable: no tools are available in this session."
    return f"Tool {name!r} is unavailable; available tools: {', '.join(available)}."


def _listing(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


def _thinking_text(parsed: ParsedMessage, calls: Sequence[ToolCall], problems: int) -> str:
    said = parsed.text
    if len(said) > 80:
        said = said[:79] + "…"
    plan: list[str] = []
    if parsed.refuse:
        plan.append("decline")
    else:
        if said:
            plan.append("echo it back")
        if parsed.long_words is not None:
            plan.append(f"write {parsed.long_words} words")
        if parsed.remember:
            plan.append(f"note {len(parsed.remember)} item(s) for memory")
        if parsed.memories:
            plan.append("list what I remember")
        if parsed.options:
            plan.append("report my options")
        if parsed.help:
            plan.append("list my commands")
        if problems:
            plan.append(f"point out {problems} problem(s)")
        if calls:
            plan.append(f"call {', '.join(call.name for call in calls)}")
    opening = f'The user said "{said}".' if said else "The user sent only commands."
    return f"{opening} I will {_listing(plan) or 'answer briefly'}."


# --- tool results ---------------------------------------------------------------------------


def result_preview(content: Content, limit: int = MAX_RESULT_CHARS) -> str:
    """One line for a tool result: whitespace collapsed, cut at `limit` characters, and
    `denied (…)` when the call was denied."""
    text = " ".join(message_text(content).split())
    if text.startswith(DENIED):
        detail = text[len(DENIED) :].lstrip(" :")
        text = f"denied ({detail})" if detail else "denied"
    if not text:
        return "(empty)"
    if len(text) > limit:
        return text[: limit - 1] + "…"
    return text


def summarize_tool_results(history: Sequence[HistoryMessage]) -> str:
    """Name each result of the last assistant message's tool calls, in call order."""
    start = len(history)
    while start > 0 and not isinstance(history[start - 1], AssistantMessage):
        start -= 1
    names: dict[str, str] = {}
    if start > 0:
        content = history[start - 1].content
        if isinstance(content, list):
            names = {b.tool_call_id: b.name for b in content if isinstance(b, ToolUseContentBlock)}
    results = {m.tool_call_id: m.content for m in history[start:] if isinstance(m, ToolMessage)}
    order = [call_id for call_id in names if call_id in results]
    order += [call_id for call_id in results if call_id not in names]
    parts = [
        f"{names.get(call_id, 'unknown tool')} → {result_preview(results[call_id])}"
        for call_id in order
    ]
    return "Tool results: " + ("; ".join(parts) or "(none)")


# --- the reply ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One planned response: wait `sleep` seconds, yield `outputs`, then fail if `fail`."""

    outputs: list[ModelOutput]
    sleep: float = 0.0
    fail: bool = False


def _text_deltas(text: str) -> list[ModelOutput]:
    return [TextDelta(text=piece) for piece in chunk_text(text)]


def _newest_user_text(history: Sequence[HistoryMessage]) -> str:
    for message in reversed(history):
        if isinstance(message, UserMessage):
            return message_text(message.content)
    return ""


def _plan_for_message(parsed: ParsedMessage, request: ModelRequest) -> list[ModelOutput]:
    available = [tool.name for tool in request.tools]
    calls: list[ToolCall] = []
    problems = list(parsed.problems)
    for line in parsed.calls:
        if line.name in available:
            calls.append(ToolCall(name=line.name, input=line.input))
        else:
            problems.append(_unavailable_text(line.name, available))

    outputs: list[ModelOutput] = []
    if parsed.think:
        thinking = _thinking_text(parsed, calls, len(problems))
        outputs += [ThinkingDelta(text=piece) for piece in chunk_text(thinking)]
    if parsed.refuse:
        return [*outputs, TextDelta(text=REFUSAL), ModelStop(reason="refusal")]
    if parsed.remember:
        outputs.append(Remember(items=list(parsed.remember)))

    parts: list[str] = []
    if parsed.text:
        parts.append(f"Echo: {parsed.text}")
    if parsed.long_words:
        parts.append(long_text(parsed.long_words))
    parts += [f"Noted for memory: {item}" for item in parsed.remember]
    if parsed.memories:
        parts.append(_memories_text(request.memory))
    if parsed.options:
        parts.append(_options_text(request.options))
    if parsed.help:
        parts.append(HELP)
    parts += problems
    if not parts and not calls:
        parts.append(f"Done (waited {parsed.sleep:g} s)." if parsed.sleep else "(nothing to echo)")
    if parts:
        outputs += _text_deltas(shape("\n\n".join(parts), request.options))
    return [*outputs, *calls]


def plan_reply(request: ModelRequest, newest_user_text: str | None = None) -> Reply:
    """The whole response to `request`, decided up front (no I/O). `newest_user_text`: the
    newest user message's text, when the caller has it already."""
    if request.history and isinstance(request.history[-1], ToolMessage):
        summary = summarize_tool_results(request.history)
        return Reply(outputs=_text_deltas(shape(summary, request.options)))
    if newest_user_text is None:
        newest_user_text = _newest_user_text(request.history)
    parsed = parse_message(newest_user_text)
    outputs = _plan_for_message(parsed, request)
    if parsed.fail:
        # Keep everything up to and including the first delta, then fail.
        first = next(
            (i for i, o in enumerate(outputs) if isinstance(o, TextDelta | ThinkingDelta)),
            -1,
        )
        outputs = outputs[: first + 1]
    return Reply(outputs=outputs, sleep=parsed.sleep, fail=parsed.fail)


# Planning is pure Python over the newest message: a huge one is planned on a thread so the
# event loop keeps answering other clients (for a small one the hand-off costs more).
PLAN_ON_THREAD_CHARS = 64 * 1024


class DemoModel(TurnModel):
    """Plays the planned reply: sleeps, streams the outputs, and fails if asked to."""

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        text = _newest_user_text(request.history)
        if len(text) > PLAN_ON_THREAD_CHARS:
            reply = await asyncio.to_thread(plan_reply, request, text)
        else:
            reply = plan_reply(request, text)
        if reply.sleep > 0:
            await asyncio.sleep(reply.sleep)
        for output in reply.outputs:
            yield output
        if reply.fail:
            raise RuntimeError("demo model failure")
