"""One guarded turn per agent kind, and the audit records of its steps: what the guardian saw.

Offline, on loopback, with real processes: one `aap-server serve --config aap.toml` declaring an
`llm` agent per kind (plain; MCP tools from the test notes server, a real stdio process it
starts; a knowledge folder; memory; A2A delegation to a second `aap-server` process; AOM
surfaces served by a site) beside the bundled `demo` agent. The model is the fake
OpenAI-compatible endpoint the tests use, scripted so each agent takes its kind's step. Each
turn runs over HTTP (`POST /sessions/{id}/turns`); its session's `GET /sessions/{id}/audit` is
printed as a table (for the A2A turn, the peer's session too: the delegated turn it ran).

    python bench/agent_turns.py   (from the project root, after `pip install -e '.[dev]'`)

Not a benchmark: it prints no timings. It lives in bench/ beside the other scripts that start
servers and reuse the tests' harness (tests/toolkits, tests/e2e); tests/e2e/test_agent_turns.py
runs it, so it cannot rot.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.conftest import serve
from tests.e2e.server_process import ServerProcess, server_process
from tests.e2e.test_a2a import exposing_server, peers_table
from tests.e2e.test_aom import AOM_TOOLS, CREDENTIALS, Site
from tests.e2e.test_mcp_knowledge_memory import agent_table, docs_folder, notes_server
from tests.toolkits.fake_openai import FakeOpenAI, Reply, fake_openai, text_reply, tool_calls_reply

ALICE = {"Authorization": "Bearer key-alice"}


@dataclass
class Loopback:
    """What the agents reach: the model, the A2A peer (and its model), the AOM site."""

    model: FakeOpenAI
    peer: ServerProcess
    peer_model: FakeOpenAI
    site: Site


@dataclass
class Kind:
    """One agent kind: its config table, the turn it is sent and the model's scripted replies."""

    kind: str
    agent: str
    method: str  # the AOS method its characteristic step is checked as
    text: str  # the user's message; `$SITE` stands for the AOM site's base URL
    tools: list[str] = field(default_factory=list)  # enabled for the session, trusted
    table: Callable[[Loopback, Path], str] | None = None  # None: not in the config (bundled)
    replies: Callable[[Loopback], list[Reply]] = lambda _: []
    peer_replies: list[Reply] = field(default_factory=list)


def login(loopback: Loopback) -> str:
    return f"{loopback.site.base_url}/login"


KINDS = [
    Kind(
        "llm",
        "chat",
        "steps/message",
        "Say hello.",
        table=lambda lo, _: agent_table("chat", lo.model.base_url, ""),
        replies=lambda _: [text_reply("Hello", " there.")],
    ),
    Kind(
        "llm + MCP tools",
        "librarian",
        "protocols/MCP",
        "How do I make tea?",
        tools=["notes__lookup"],
        table=lambda lo, work: agent_table("librarian", lo.model.base_url, notes_server(work)),
        replies=lambda _: [
            tool_calls_reply(("notes__lookup", {"topic": "tea"})),
            text_reply("Steep it at 80 degrees."),
        ],
    ),
    Kind(
        "llm + knowledge",
        "docs",
        "steps/knowledgeRetrieval",
        "How do I descale the kettle?",
        table=lambda lo, work: agent_table(
            "docs",
            lo.model.base_url,
            f"knowledge = [{json.dumps(str(docs_folder(work)))}]\n"
            'knowledge_confidential = ["hr/*"]\n',
        ),
        replies=lambda _: [
            tool_calls_reply(("search_knowledge", {"query": "kettle descaling"})),
            text_reply("Use vinegar [manual.pdf#1]."),
        ],
    ),
    Kind(
        "llm + memory",
        "buddy",
        "steps/memoryStore",
        "I like green tea.",
        table=lambda lo, work: agent_table(
            "buddy",
            lo.model.base_url,
            f"memory = true\nmemory_db = {json.dumps(str(work / 'memory.db'))}\n",
        ),
        replies=lambda _: [
            tool_calls_reply(("remember", {"items": ["Alice prefers green tea"]})),
            text_reply("Noted."),
        ],
    ),
    Kind(
        "llm + A2A delegation",
        "boss",
        "protocols/A2A",
        "Ask the helper: 6 x 7?",
        tools=["a2a__helper"],
        table=lambda lo, _: agent_table("boss", lo.model.base_url, peers_table(lo.peer)),
        replies=lambda _: [
            tool_calls_reply(("a2a__helper", {"message": "What is 6 times 7?"})),
            text_reply("The helper says 42."),
        ],
        peer_replies=[text_reply("42")],
    ),
    Kind(
        "llm web agent + AOM",
        "web",
        "steps/toolCallRequest",
        "Sign me in at $SITE/login as ada@example.test, password correct horse.",
        tools=AOM_TOOLS,
        table=lambda lo, _: agent_table(
            "web", lo.model.base_url, f"tools = {json.dumps(AOM_TOOLS)}\n"
        ),
        replies=lambda lo: [
            tool_calls_reply(("aom_read_surface", {"url": login(lo)})),
            tool_calls_reply(
                (
                    "aom_invoke",
                    {"surface": login(lo), "action": "submit_login", "params": CREDENTIALS},
                )
            ),
            text_reply("Signed in as Test User."),
        ],
    ),
    Kind(
        "demo (bundled Python agent)",
        "demo",
        "steps/toolCallRequest",
        '/tool calculator {"expression": "6*7"}',
        tools=["calculator"],
    ),
]


@dataclass
class Turn:
    kind: Kind
    text: str
    stop_reason: str
    answer: str
    records: list[dict[str, Any]]
    # The A2A peer's sessions started by this turn, each with its audit records.
    peer_sessions: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


async def session_audit(client: httpx.AsyncClient, session_id: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        page = await client.get(
            f"/sessions/{session_id}/audit", params={"after": after} if after else None
        )
        page.raise_for_status()
        body = page.json()
        records += body["records"]
        after = body.get("next")
        if not after:
            return records


async def one_turn(client: httpx.AsyncClient, kind: Kind, text: str) -> tuple[str, dict[str, Any]]:
    """A new session of the kind's agent (its tools enabled, trusted) and one `none` turn."""
    refs = [{"name": tool, "trust": True} for tool in kind.tools]
    created = await client.post("/sessions", json={"agent": {"name": kind.agent, "tools": refs}})
    created.raise_for_status()
    session_id: str = created.json()["sessionId"]
    answered = await client.post(
        f"/sessions/{session_id}/turns",
        json={"messages": [{"role": "user", "content": text}]},
    )
    answered.raise_for_status()
    body: dict[str, Any] = answered.json()
    return session_id, body


async def peer_sessions(
    peer: ServerProcess, seen: set[str]
) -> list[tuple[str, list[dict[str, Any]]]]:
    """The peer's sessions not yet in `seen` (those a delegation just started), with audits."""
    found = []
    async with httpx.AsyncClient(base_url=peer.base_url, headers=ALICE, timeout=60) as client:
        listed = (await client.get("/sessions")).json()["sessions"]
        for listed_session in listed:
            session_id = listed_session["sessionId"]
            if session_id not in seen:
                seen.add(session_id)
                agent = listed_session["agent"]["name"]
                found.append((agent, await session_audit(client, session_id)))
    return found


def config(loopback: Loopback, workdir: Path) -> str:
    tables = [kind.table(loopback, workdir) for kind in KINDS if kind.table]
    return "".join(tables)


async def run(workdir: Path) -> list[Turn]:
    """Start everything on loopback under `workdir`, run one turn per kind, stop everything."""
    async with AsyncExitStack() as stack:
        model = await stack.enter_async_context(fake_openai())
        peer_model = await stack.enter_async_context(fake_openai())
        site = Site()
        site.base_url = await stack.enter_async_context(serve(site, lifespan="off"))
        peer = await stack.enter_async_context(exposing_server(workdir, peer_model))
        loopback = Loopback(model, peer, peer_model, site)
        config_file = workdir / "aap.toml"
        config_file.write_text(config(loopback, workdir), encoding="utf-8")
        main_dir = workdir / "main"
        main_dir.mkdir()
        server = await stack.enter_async_context(
            server_process(main_dir, "--config", str(config_file), PEER_KEY="key-alice")
        )
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=server.base_url, headers=ALICE, timeout=120)
        )
        seen_on_peer: set[str] = set()
        turns = []
        for kind in KINDS:
            model.script(*kind.replies(loopback))
            peer_model.script(*kind.peer_replies)
            posts_before = len(site.posts)
            text = kind.text.replace("$SITE", site.base_url)
            session_id, answer = await one_turn(client, kind, text)
            turn = Turn(
                kind,
                text,
                answer["stopReason"],
                str(answer["messages"][-1].get("content", "")) if answer["messages"] else "",
                await session_audit(client, session_id),
            )
            if kind.peer_replies:
                turn.peer_sessions = await peer_sessions(peer, seen_on_peer)
            for path, sent in site.posts[posts_before:]:
                turn.notes.append(f"the site received {sent['action_id']} on {path}")
            turns.append(turn)
        return turns


def table(records: list[dict[str, Any]], indent: str = "  ") -> list[str]:
    rows = [("seq", "method", "decision", "rule", "reasons")]
    rows += [
        (
            str(record["seq"]),
            record["method"],
            record["decision"],
            record.get("ruleId") or "-",
            ",".join(record["reasonCodes"]) or "-",
        )
        for record in records
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    # seq right-aligned, method/decision/rule padded, reasons last (unpadded).
    return [
        indent
        + "  ".join(
            [row[0].rjust(widths[0])]
            + [cell.ljust(width) for cell, width in zip(row[1:4], widths[1:], strict=True)]
            + [row[4]]
        )
        for row in rows
    ]


def render(turns: list[Turn]) -> str:
    lines = ["One guarded turn per agent kind: GET /sessions/{id}/audit after each turn", ""]
    for turn in turns:
        kind = turn.kind
        lines.append(f"== {kind.kind}: agent {kind.agent!r} (its step: {kind.method})")
        lines.append(f"  user: {turn.text}")
        lines.append(f"  stop reason: {turn.stop_reason}; answer: {turn.answer}")
        lines += [f"  {note}" for note in turn.notes]
        lines += table(turn.records)
        for agent, records in turn.peer_sessions:
            lines.append(f"  on the A2A peer, the delegated turn of agent {agent!r}:")
            lines += table(records, indent="    ")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="agent-turns-") as workdir:
        turns = asyncio.run(run(Path(workdir)))
    print(render(turns))


if __name__ == "__main__":
    main()
