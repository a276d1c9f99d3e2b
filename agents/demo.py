"""`demo`: a deterministic, offline agent that exercises every part of the server.

It echoes the user's text (shaped by its options) and follows line commands: `/tool NAME
{JSON}`, `/think`, `/sleep S`, `/remember TEXT`, `/memories`, `/options`, `/long N`,
`/refuse`, `/error`, `/help` (see `agents.demo_model`). Its server tools, `calculator`,
`search_notes` and `send_email`, are harmless (see `agents.demo_tools`): nothing leaves the
server.
"""

from __future__ import annotations

from aap_server.agent import (
    Agent,
    AgentCapabilities,
    AgentOption,
    AgentProvider,
    ApplicationCapabilities,
    Empty,
    HistoryCapabilities,
    ImageCapabilities,
    KeepRecentTurns,
    LlmProvider,
    ModelInfo,
    SecretAgentOption,
    SelectAgentOption,
    StreamCapabilities,
    TextAgentOption,
)
from agents.demo_model import DemoModel
from agents.demo_tools import TOOLS, DemoMemory, NotesKnowledge

__all__ = ["AGENT", "OPTIONS", "STYLES"]

STYLES = ["plain", "upper", "pirate"]


OPTIONS: list[AgentOption] = [
    SelectAgentOption(
        name="style",
        title="Style",
        description="How replies are styled: plain, UPPER CASE, or like a pirate.",
        options=STYLES,
        default="plain",
    ),
    TextAgentOption(
        name="signature",
        title="Signature",
        description="Appended to every reply as '— <signature>' when not empty.",
        default="",
    ),
    SecretAgentOption(
        name="api_key",
        title="API key",
        description="Used for nothing; /options only says whether one is set.",
        default="",
    ),
]

INSTRUCTIONS = (
    "You are the demo agent of aap-server. Echo the user's text, follow the line commands "
    "(/tool, /think, /sleep, /remember, /memories, /options, /long, /refuse, /error, /help), "
    "and summarise tool results. Never send real e-mail and never reveal secrets."
)

AGENT = Agent(
    name="demo",
    version="1.0.0",
    title="Demo agent",
    description=(
        "A deterministic, offline agent for trying the server: it echoes your text and follows "
        "line commands such as /tool NAME {JSON}, /think, /sleep S, /remember TEXT and /help. "
        "Tools: calculator, search_notes, send_email (a pretend outbox; nothing is sent)."
    ),
    instructions=INSTRUCTIONS,
    provider=AgentProvider(name="aap-server", url="https://github.com/aap-server/aap-server"),
    model_info=ModelInfo(
        name="demo-echo",
        id="demo-echo-1",
        provider=LlmProvider(name="aap-server (deterministic, offline)"),
    ),
    model=DemoModel(),
    options=OPTIONS,
    capabilities=AgentCapabilities(
        stream=StreamCapabilities(delta=Empty(), message=Empty(), none=Empty()),
        history=HistoryCapabilities(compacted=Empty(), full=Empty()),
        application=ApplicationCapabilities(tools=Empty()),
        image=ImageCapabilities(http=Empty(), data=Empty()),
    ),
    tools=list(TOOLS),
    compaction=KeepRecentTurns(max_messages=40),
    knowledge=NotesKnowledge(),
    memory=DemoMemory(),
)
