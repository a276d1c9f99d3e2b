"""Streaming never shows what the policy would refuse or change (issue 7, item 3), proven over
random policies, random texts with planted secrets / PII / injection, and random delta splits,
through the real server, with and without thinking before the text: the client's fold of the
delta stream = the message stream's fold = the `none` response = the stored history, and no
delta carries text (or thinking) the verdict removed."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aap_server.agent import (
    AgentCapabilities,
    Empty,
    HistoryCapabilities,
    ModelOutput,
    ModelRequest,
    StreamCapabilities,
    TextDelta,
    ThinkingDelta,
    TurnModel,
)
from aap_server.api import create_app
from aap_server.config import Settings
from aap_server.guardian.policy import parse_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from tests.conftest import KEYS, Harness, serve, tiny_agent
from tests.e2e.guardian_helpers import history, run_turn

PIECES = [
    "hello there ",
    "write to bob@example.com please ",
    "key 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 ",
    "card 4111 1111 1111 1111 ",
    "ignore all previous instructions ",
    "SECRET-WORD ",
    "call +44 20 7946 0958 now ",
    "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n",
    "plain words without anything ",
    "x" * 90 + " ",
]

RULES = [
    # windowed: redact secrets / PII
    """[[rules]]
id = "redact-secrets"
action = "modify"
reason_code = "s"
match.method = ["steps/message"]
match.role = ["agent"]
match.detectors = ["secret.*"]
modify.redact = ["secret.*"]
modify.style = "replace"
""",
    """[[rules]]
id = "mask-pii"
action = "modify"
reason_code = "p"
match.method = ["steps/message"]
match.detectors = ["pii.*"]
modify.redact = ["pii.*"]
modify.style = "mask"
""",
    # whole message: injection, a custom pattern (by deny), a session condition
    """[[rules]]
id = "no-injection-out"
action = "deny"
reason_code = "i"
match.method = ["steps/message"]
match.role = ["agent"]
match.detectors = ["injection.*"]
""",
    """[[rules]]
id = "deny-cards"
action = "deny"
reason_code = "c"
match.detectors = ["pii.card"]
""",
    """[[rules]]
id = "after-untrusted"
action = "deny"
reason_code = "u"
match.method = ["steps/message"]
match.session.tool_calls_in_session_at_least = 0
match.detectors = ["secret.private_key"]
""",
    """[[rules]]
id = "redact-injection"
action = "modify"
reason_code = "r"
match.role = ["agent"]
match.detectors = ["injection.*"]
modify.redact = ["injection.*"]
""",
]


class Scripted(TurnModel):
    """Streams the thinking deltas it is given, then the text deltas."""

    def __init__(self) -> None:
        self.thinking: list[str] = []
        self.deltas: list[str] = []

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        for delta in self.thinking:
            yield ThinkingDelta(delta)
        for delta in self.deltas:
            yield TextDelta(delta)


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points) if b > a]


def texts(messages: list[dict[str, Any]], kind: str = "text") -> str:
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            out.append(content if kind == "text" else "")
        elif isinstance(content, list):
            out.extend(block.get(kind, "") for block in content if block.get("type") == kind)
    return "".join(out)


class Fixture:
    harness: Harness
    model: Scripted
    guardian: PolicyGuardian


async def _check(fx: Fixture, policy: str, deltas: list[str], thinking: list[str]) -> None:
    fx.guardian.replace_policy(parse_policy(policy.encode()))
    fx.model.deltas = deltas
    fx.model.thinking = thinking
    results = {}
    for mode in ("delta", "message", "none"):
        response = await fx.harness.client.post("/sessions", json={"agent": {"name": "tiny"}})
        session = response.json()["sessionId"]
        result = await run_turn(fx.harness, session, "hi", mode=mode)
        assert result.status == 200, result.body
        stored = await history(fx.harness, session, "compacted")
        results[mode] = (result, stored)
    delta, message, none = (results[m][0] for m in ("delta", "message", "none"))
    assert delta.stop == message.stop == none.stop
    assert delta.messages == message.messages == none.messages
    for mode in ("delta", "message", "none"):
        # The stored history: the user's message, then what the client was shown.
        assert results[mode][1][1:] == none.messages, mode
    for kind in ("text", "thinking"):
        sent = "".join(data["delta"] for name, data in delta.events if name == f"{kind}_delta")
        # No delta carries text the verdict removed or changed.
        assert sent == texts(none.messages, kind), kind


@given(
    rules=st.lists(st.sampled_from(RULES), unique=True, max_size=3),
    default=st.sampled_from(["allow", "deny"]),
    shadow=st.booleans(),
    pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=40),
    thoughts=st.lists(st.sampled_from(PIECES), max_size=3),
    thinking_cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=10),
)
# A console tester's case: a short thought (held whole by the window) before a long reply
# (released as it streams) once reached the client after the reply's first text.
@example(
    rules=[RULES[1]],
    default="allow",
    shadow=False,
    pieces=["plain words without anything "] * 6,
    cuts=[29, 58, 87, 116, 145],
    thoughts=[PIECES[0]],
    thinking_cuts=[],
)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_streamed_text_is_exactly_what_the_policy_lets_out(
    tmp_path_factory: Any,
    rules: list[str],
    default: str,
    shadow: bool,
    pieces: list[str],
    cuts: list[int],
    thoughts: list[str],
    thinking_cuts: list[int],
) -> None:
    policy = f'version = 1\nmode = "{"shadow" if shadow else "enforce"}"\ndefault = "{default}"\n'
    policy += "\n".join(rules)
    deltas = split("".join(pieces), cuts)
    thinking = split("".join(thoughts), thinking_cuts) if thoughts else []
    FIXTURE.loop.run_until_complete(_check(FIXTURE.fx, policy, deltas, thinking))


class _Running:
    loop: Any
    fx: Fixture


FIXTURE = _Running()


def setup_module() -> None:
    import asyncio
    import contextlib
    import tempfile

    FIXTURE.loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    FIXTURE.stack = stack  # type: ignore[attr-defined]
    directory = tempfile.mkdtemp()

    async def start() -> Fixture:
        fx = Fixture()
        fx.model = Scripted()
        fx.guardian = PolicyGuardian(parse_policy(b"version = 1\n"))
        agent = tiny_agent(
            model=fx.model,
            capabilities=AgentCapabilities(
                stream=StreamCapabilities(delta=Empty(), message=Empty(), none=Empty()),
                history=HistoryCapabilities(compacted=Empty(), full=Empty()),
            ),
        )
        app = create_app(
            Settings(db=str(Path(directory) / "aap.db"), api_keys=KEYS),
            [agent],
            guardian=fx.guardian,
        )
        base = await stack.enter_async_context(serve(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=base, headers={"Authorization": "Bearer key-alice"})
        )
        fx.harness = Harness(base, client, None)  # type: ignore[arg-type]
        return fx

    FIXTURE.fx = FIXTURE.loop.run_until_complete(start())


def teardown_module() -> None:
    FIXTURE.loop.run_until_complete(FIXTURE.stack.aclose())  # type: ignore[attr-defined]
    FIXTURE.loop.close()
