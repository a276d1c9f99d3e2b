"""The demo agent's server tools, knowledge and memory: deterministic, offline, harmless.

- `calculator`: safe arithmetic over an `ast` whitelist, with size limits so it cannot hang.
- `search_notes`: keyword search over a few built-in notes (one of them plainly confidential,
  to exercise the guardian's knowledge step), through `ToolContext.retrieve_knowledge`.
- `send_email`: never sends anything; queues the message in a per-session outbox in state.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aap_server.agent import (
    AgentState,
    Knowledge,
    KnowledgeItem,
    Memory,
    ServerTool,
    ToolContext,
    ToolError,
)

__all__ = [
    "CALCULATOR",
    "MAX_EXPRESSION_CHARS",
    "MAX_MEMORIES",
    "NOTES",
    "OUTBOX_KEY",
    "SEARCH_NOTES",
    "SEND_EMAIL",
    "TOOLS",
    "DemoMemory",
    "Note",
    "NotesKnowledge",
    "evaluate",
    "format_number",
    "score_note",
    "search",
    "words_of",
]


def _object_schema(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _string_argument(arguments: dict[str, Any], name: str, max_chars: int) -> str:
    value = arguments.get(name)
    if not isinstance(value, str):
        raise ToolError(f"{name!r} must be a string")
    if len(value) > max_chars:
        raise ToolError(f"{name!r} is too long ({len(value)} characters; at most {max_chars})")
    return value


# --- calculator ---------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 200
# Limits that keep every step fast: exponents, and the size of any integer (about 1,200
# digits). Floats overflow to an error instead of `inf`.
MAX_EXPONENT = 10_000
MAX_INT_BITS = 4096

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def _checked(value: Any) -> Number:
    if isinstance(value, complex):
        raise ToolError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is too large")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError("the result is too large")
    assert isinstance(value, int | float)
    return value


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise ToolError(f"exponent too large (at most {MAX_EXPONENT} in magnitude)")
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent > 0
        and abs(base) > 1
        and (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS
    ):
        raise ToolError("the result is too large")
    return _checked(base**exponent)


def _evaluate_node(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate_node(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ToolError(f"only numbers are allowed, not {value!r}")
        return _checked(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_evaluate_node(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _evaluate_node(node.left)
        right = _evaluate_node(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    raise ToolError(
        f"unsupported syntax ({type(node).__name__}): only numbers, + - * / // % **, "
        "unary + and -, and parentheses are allowed"
    )


def evaluate(expression: str) -> Number:
    """Evaluate plain arithmetic safely, or raise `ToolError` saying why not."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression too long (at most {MAX_EXPRESSION_CHARS} characters)")
    if not expression.strip():
        raise ToolError("empty expression")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise ToolError(f"invalid expression: {expression.strip()!r}") from error
    try:
        return _evaluate_node(tree)
    except ZeroDivisionError as error:
        raise ToolError("division by zero") from error
    except OverflowError as error:
        raise ToolError("the result is too large") from error
    except RecursionError as error:
        raise ToolError("expression nested too deeply") from error


def format_number(value: Number) -> str:
    """Integers (and integral floats) without `.0`; other floats to 15 significant digits."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.15g}"


async def _run_calculator(arguments: dict[str, Any], ctx: ToolContext) -> str:
    expression = _string_argument(arguments, "expression", MAX_EXPRESSION_CHARS)
    return format_number(evaluate(expression))


CALCULATOR = ServerTool(
    name="calculator",
    title="Calculator",
    description=(
        "Evaluate an arithmetic expression: numbers, + - * / // % **, unary + and -, "
        f"parentheses; at most {MAX_EXPRESSION_CHARS} characters."
    ),
    parameters=_object_schema(
        {
            "expression": {
                "type": "string",
                "description": "The expression, e.g. (2 + 3) * 4 ** 2",
                "maxLength": MAX_EXPRESSION_CHARS,
            }
        }
    ),
    run=_run_calculator,
    timeout_seconds=5.0,
)


# --- notes (knowledge) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Note:
    """One built-in note."""

    id: str
    title: str
    content: str


NOTES: tuple[Note, ...] = (
    Note(
        "note-welcome",
        "Welcome to the demo agent",
        "The demo agent echoes what you write. It can also use tools: the calculator, "
        "a notes search and a pretend e-mail outbox. Nothing leaves the server.",
    ),
    Note(
        "note-office-hours",
        "Office hours",
        "The support desk is open Monday to Friday, 9:00 to 17:00 CET. Urgent incidents "
        "outside office hours go to the on-call phone.",
    ),
    Note(
        "note-expenses",
        "Expense policy",
        "Travel and meal expenses need a receipt. Submit claims within 30 days; the finance "
        "team reviews them every Friday. The policy limit for a dinner is 60 EUR.",
    ),
    Note(
        "note-payroll",
        "Payroll 2024 (CONFIDENTIAL)",
        "CONFIDENTIAL - HR and finance only. Salary table 2024 (fake demo data):\n"
        "Alice Martin, engineering lead: 98,000 EUR salary\n"
        "Bob Nguyen, designer: 71,500 EUR salary\n"
        "Carol Diaz, finance manager: 84,250 EUR salary\n"
        "Payroll runs on the 25th of each month.",
    ),
    Note(
        "note-security",
        "Security checklist",
        "Use a password manager, turn on two-factor authentication, lock your screen, and "
        "report phishing to the security team. Never share an API key in chat.",
    ),
    Note(
        "note-onboarding",
        "Onboarding checklist",
        "New team members get a laptop on day one, read the security checklist, meet their "
        "buddy, and join the weekly team meeting on Monday.",
    ),
    Note(
        "note-release",
        "Release process",
        "Releases ship every second Tuesday: freeze the branch, run the full test suite, "
        "write the changelog, tag the version, and announce it to the team.",
    ),
)

MAX_RESULTS = 3
_STOP_WORD_TEXT = (
    "a an and are at be by for from how i in is it me my of on or the to what when where "
    "who with you your"
)
_STOP_WORDS = frozenset(_STOP_WORD_TEXT.split())


def words_of(text: str) -> set[str]:
    """The lower-cased words of `text`, without common stop words."""
    return {word for word in re.findall(r"[a-z0-9]+", text.lower()) if word not in _STOP_WORDS}


def score_note(note: Note, query_words: set[str]) -> int:
    """How many distinct query words occur in the note's id, title or content."""
    return len(query_words & words_of(f"{note.id} {note.title} {note.content}"))


def search(query: str, keywords: list[str] | None = None) -> list[tuple[Note, int]]:
    """The best matching notes with their scores: best first (ties in note order), at most
    `MAX_RESULTS`, only notes sharing at least one word with the query."""
    query_words = words_of(" ".join([query, *(keywords or [])]))
    scored = [(note, score_note(note, query_words)) for note in NOTES]
    ranked = sorted((pair for pair in scored if pair[1] > 0), key=lambda pair: -pair[1])
    return ranked[:MAX_RESULTS]


class NotesKnowledge(Knowledge):
    """The built-in notes as the agent's knowledge source."""

    async def retrieve(self, query: str, keywords: list[str] | None) -> list[KnowledgeItem]:
        return [
            KnowledgeItem(
                id=note.id,
                content=note.content,
                mime_type="text/plain",
                metadata={"title": note.title, "score": score},
            )
            for note, score in search(query, keywords)
        ]


MAX_QUERY_CHARS = 500


async def _run_search_notes(arguments: dict[str, Any], ctx: ToolContext) -> str:
    query = _string_argument(arguments, "query", MAX_QUERY_CHARS).strip()
    if not query:
        raise ToolError("'query' must not be empty")
    items = await ctx.retrieve_knowledge(query)
    if not items:
        return f"No notes match {query!r}."
    lines = [f"{len(items)} note(s) match {query!r}:"]
    for item in items:
        title = (item.metadata or {}).get("title")
        heading = f"[{item.id}] {title}" if isinstance(title, str) else f"[{item.id}]"
        lines.append(f"\n{heading}\n{item.content}")
    return "\n".join(lines)


SEARCH_NOTES = ServerTool(
    name="search_notes",
    title="Search notes",
    description=(
        "Search the team's notes by keywords; returns at most 3 matching notes, best first."
    ),
    parameters=_object_schema(
        {
            "query": {
                "type": "string",
                "description": "Keywords to look for, e.g. 'expense policy'",
                "maxLength": MAX_QUERY_CHARS,
            }
        }
    ),
    run=_run_search_notes,
    timeout_seconds=5.0,
)


# --- send_email (a pretend outbox) ----------------------------------------------------------

OUTBOX_KEY = "outbox"
MAX_OUTBOX = 100
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s.]+")


async def _run_send_email(arguments: dict[str, Any], ctx: ToolContext) -> str:
    to = _string_argument(arguments, "to", 254).strip()
    subject = _string_argument(arguments, "subject", 200)
    body = _string_argument(arguments, "body", 10_000)
    if not _EMAIL.fullmatch(to):
        raise ToolError(f"{to!r} is not an e-mail address")
    stored = ctx.state.get(OUTBOX_KEY)
    outbox: list[Any] = list(stored) if isinstance(stored, list) else []
    if len(outbox) >= MAX_OUTBOX:
        raise ToolError(f"the demo outbox is full ({MAX_OUTBOX} messages)")
    outbox.append({"to": to, "subject": subject, "body": body})
    ctx.state.set(OUTBOX_KEY, outbox)
    return f"Queued message #{len(outbox)} to {to} (demo outbox; nothing is sent)"


SEND_EMAIL = ServerTool(
    name="send_email",
    title="Send e-mail (demo)",
    description="Queue an e-mail in this session's demo outbox. Nothing is actually sent.",
    parameters=_object_schema(
        {
            "to": {"type": "string", "description": "Recipient address", "maxLength": 254},
            "subject": {"type": "string", "maxLength": 200},
            "body": {"type": "string", "maxLength": 10_000},
        }
    ),
    run=_run_send_email,
    timeout_seconds=5.0,
    # What the guardian's provenance rules read: a call sends, to the address in `to`.
    consequence="sends",
    targets=("to",),
)

TOOLS: list[ServerTool] = [CALCULATOR, SEARCH_NOTES, SEND_EMAIL]


# --- memory ------------------------------------------------------------------------------

MEMORY_KEY = "memories"
MAX_MEMORIES = 20


class DemoMemory(Memory):
    """The last `MAX_MEMORIES` remembered items, kept in the session's agent state."""

    async def recall(self, state: AgentState) -> list[str]:
        stored = state.get(MEMORY_KEY)
        if not isinstance(stored, list):
            return []
        return [item for item in stored if isinstance(item, str)]

    async def remember(self, state: AgentState, items: list[str]) -> None:
        if not items:
            return
        memories = [*await self.recall(state), *items]
        state.set(MEMORY_KEY, memories[-MAX_MEMORIES:])
