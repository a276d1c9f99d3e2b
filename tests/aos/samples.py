"""Realistic AOS objects for the tests: one request per method, built with the Structs."""

from typing import Any

from aap_server.aos import (
    A2aMessage,
    A2aParams,
    Agent,
    AgentProvider,
    AgentTrigger,
    AgentTriggerEvent,
    AgentTriggerParams,
    AgentTriggerStep,
    AosRequest,
    DataPart,
    FileContent,
    FilePart,
    FileSource,
    KnowledgeRetrievalParams,
    KnowledgeRetrievalResult,
    KnowledgeRetrievalStep,
    KnowledgeRetrievalStepParams,
    LlmProvider,
    McpMessage,
    McpParams,
    McpServer,
    MemoryContextRetrievalParams,
    MemoryContextRetrievalStep,
    MemoryStoreParams,
    MemoryStoreStep,
    Message,
    MessageParams,
    MessageStep,
    Model,
    Organization,
    PingParams,
    PingRequest,
    Resource,
    Session,
    SiteSource,
    StepContext,
    TextPart,
    ToolArgumentDefinition,
    ToolArgumentValue,
    ToolCallRequest,
    ToolCallRequestParams,
    ToolCallRequestStep,
    ToolCallResult,
    ToolCallResultParams,
    ToolCallResultStep,
    ToolDefinition,
    ToolOutputDefinition,
    User,
)

TIMESTAMP = "2025-06-01T12:30:00Z"

WEATHER_TOOL = ToolDefinition(
    name="get_weather",
    id="tool-weather",
    type="function_call",
    description="Current weather for a city.",
    arguments=[
        ToolArgumentDefinition(
            name="city", id="arg-city", type="string", description="City name", required=True
        ),
        ToolArgumentDefinition(name="units", type="string", mime_type=None, required=False),
    ],
    outputs=[ToolOutputDefinition(name="forecast", type="string", mime_type="text/plain")],
)

CLOCK_TOOL = ToolDefinition(
    name="now", id="tool-now", type="function_call", arguments=None, outputs=None
)

ACME = Organization(id="org-acme", name="Acme", metadata={"tier": "enterprise"})

AGENT = Agent(
    name="Weather assistant",
    id="agent-weather",
    description="Answers questions about the weather.",
    instructions="You are a helpful weather assistant.",
    version="1.4.0",
    provider=AgentProvider(name="Acme Labs", url="https://acme.example"),
    model=Model(
        name="GPT-4o",
        id="gpt-4o",
        provider=LlmProvider(name="OpenAI"),
        max_tokens=1024,
        context_window=128000,
        stop_sequences=["User:"],
        default_params={"temperature": 0.2, "topK": 40},
    ),
    tools=[WEATHER_TOOL, CLOCK_TOOL],
    mcp_servers=[McpServer(name="weather-mcp", version="0.3.1")],
    resources=[
        Resource(
            name="Handbook",
            id="res-handbook",
            description="Employee handbook",
            content="Be kind.",
            mime_type="text/plain",
        )
    ],
    organization=ACME,
    metadata={"deployment": "eu-west"},
)


def step_context(step_id: str = "step-1") -> StepContext:
    return StepContext(
        agent=AGENT,
        session=Session(id="sess-42", metadata={"channel": "web"}),
        turn_id="turn-3",
        step_id=step_id,
        timestamp=TIMESTAMP,
        user=User(id="user-7", name="Ada", email="ada@acme.example", organization=ACME),
    )


MCP_TOOLS_CALL: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"arguments": {"city": "Barcelona"}, "name": "get_weather"},
}

A2A_MESSAGE_SEND: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "message/send",
    "params": {
        "message": {
            "role": "agent",
            "parts": [{"kind": "text", "text": "tell me a joke"}],
            "messageId": "9229e770-767c-417b-a0b0-f0741243c589",
        },
        "metadata": {},
    },
}


def sample_requests() -> dict[str, AosRequest]:
    """One realistic request per AOS method, keyed by method name."""
    requests: list[AosRequest] = [
        AgentTriggerStep(
            id=1,
            params=AgentTriggerParams(
                context=step_context(),
                trigger=AgentTrigger(
                    type="autonomous",
                    event=AgentTriggerEvent(type="email", id="evt-9"),
                    content=[
                        TextPart(text="New email: the quarterly report is attached."),
                        FilePart(
                            file=FileContent(
                                name="report.pdf", mime_type="application/pdf", bytes="JVBERi0x"
                            )
                        ),
                    ],
                    metadata={"mailbox": "inbox"},
                ),
            ),
        ),
        KnowledgeRetrievalStep(
            id="req-2",
            params=KnowledgeRetrievalParams(
                context=step_context("step-2"),
                knowledge_step=KnowledgeRetrievalStepParams(
                    query="vacation policy",
                    keywords=["vacation", "policy"],
                    results=[
                        KnowledgeRetrievalResult(
                            id="res-handbook",
                            content="Employees get 25 days.",
                            mime_type="text/plain",
                            metadata={"score": 0.91},
                        )
                    ],
                ),
                reasoning="The user asked about vacation days.",
            ),
        ),
        MemoryStoreStep(
            id=3,
            params=MemoryStoreParams(
                context=step_context("step-3"),
                memory=['{"role":"user","text":"I live in Barcelona"}'],
                reasoning="Remember the user's city.",
            ),
        ),
        MemoryContextRetrievalStep(
            id=4,
            params=MemoryContextRetrievalParams(
                context=step_context("step-4"), memory=["The user lives in Barcelona."]
            ),
        ),
        MessageStep(
            id=5,
            params=MessageParams(
                context=step_context("step-5"),
                message=Message(
                    id="msg-5",
                    role="agent",
                    content=[
                        TextPart(text="It is sunny in Barcelona."),
                        DataPart(data={"temperature": 24, "unit": "C"}),
                        FilePart(file=FileContent(uri="https://acme.example/map.png")),
                    ],
                    metadata={"final": True},
                ),
                citation=[
                    FileSource(
                        id="res-handbook", name="handbook.pdf", url="https://acme.example/h"
                    ),
                    SiteSource(url="https://weather.example/barcelona"),
                ],
                reasoning="Forecast came from the weather tool.",
            ),
        ),
        ToolCallRequestStep(
            id=6,
            params=ToolCallRequestParams(
                context=step_context("step-6"),
                tool_call_request=ToolCallRequest(
                    execution_id="exec-1",
                    tool_id="tool-weather",
                    inputs=[
                        ToolArgumentValue(name="city", id="arg-city", value="Barcelona"),
                        ToolArgumentValue(name="units", value=None),
                    ],
                ),
                reasoning="Need the forecast.",
            ),
        ),
        ToolCallResultStep(
            id=7,
            params=ToolCallResultParams(
                context=step_context("step-7"),
                execution_id="exec-1",
                result=ToolCallResult(outputs=[TextPart(text="Sunny, 24C")], is_error=False),
            ),
        ),
        A2aMessage(id=8, params=A2aParams(message=A2A_MESSAGE_SEND, reasoning="Ask agent B.")),
        McpMessage(id=9, params=McpParams(message=MCP_TOOLS_CALL)),
        PingRequest(
            id="ping-1", params=PingParams(timestamp=TIMESTAMP, timeout=5000, metadata={"a": 1})
        ),
    ]
    return {request.method: request for request in requests}
