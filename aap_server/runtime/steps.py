"""Builds the AOS 0.1 request for each step of a turn, and reads guardian modifications back.

One `StepFactory` per turn: it holds the step context shared by every step (agent, session,
turn, user) and stamps each request with a fresh step id and timestamp.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec

from aap_server import aos
from aap_server.agent import Agent, KnowledgeItem
from aap_server.ids import new_id, new_stamped_id
from aap_server.protocol import (
    Content,
    ContentBlock,
    ImageContentBlock,
    TextContentBlock,
    ThinkingContentBlock,
    ToolSpec,
    ToolUseContentBlock,
)
from aap_server.runtime.principal import Principal

# Marks AOS parts that carry an AAP thinking block (AOS has no thinking part of its own).
_THINKING = {"aap": "thinking"}


def tool_definition(spec: ToolSpec, kind: str, trusted_output: bool = False) -> aos.ToolDefinition:
    """An AOS tool definition from a JSON-Schema tool spec (top-level properties only). Its
    metadata carries what the guardian's provenance checks read: the tool's `consequence`,
    its `targets` and whether its output is the user's own trusted data."""
    properties = spec.parameters.get("properties")
    required = spec.parameters.get("required")
    required_names = set(required) if isinstance(required, list) else set()
    arguments: list[aos.ToolArgumentDefinition] = []
    if isinstance(properties, dict):
        for name, schema in properties.items():
            schema = schema if isinstance(schema, dict) else {}
            json_type = schema.get("type")
            arguments.append(
                aos.ToolArgumentDefinition(
                    name=str(name),
                    required=name in required_names,
                    description=schema.get("description")
                    if isinstance(schema.get("description"), str)
                    else None,
                    type=json_type if isinstance(json_type, str) else None,
                )
            )
    return aos.ToolDefinition(
        name=spec.name,
        id=spec.name,
        type="function_call",
        description=spec.description,
        arguments=arguments or None,
        outputs=None,
        metadata=_tool_metadata(spec, kind, trusted_output),
    )


def _tool_metadata(spec: ToolSpec, kind: str, trusted_output: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {"side": kind}
    if spec.consequence is not None:
        metadata["consequence"] = spec.consequence
    if spec.targets:
        metadata["targets"] = list(spec.targets)
    if trusted_output:
        metadata["trustedOutput"] = True
    return metadata


def aos_agent(agent: Agent, tools: list[aos.ToolDefinition]) -> aos.Agent:
    return aos.Agent(
        name=agent.name,
        id=agent.name,
        description=agent.description,
        instructions=agent.instructions,
        version=agent.version,
        provider=agent.provider,
        model=agent.model_info,
        tools=tools or None,
    )


def content_to_parts(content: Content) -> list[aos.Part]:
    """AAP message content as AOS parts (text, thinking as marked text, images as files)."""
    if isinstance(content, str):
        return [aos.TextPart(text=content)]
    parts: list[aos.Part] = []
    for block in content:
        if isinstance(block, TextContentBlock):
            parts.append(aos.TextPart(text=block.text))
        elif isinstance(block, ThinkingContentBlock):
            parts.append(aos.TextPart(text=block.thinking, metadata=dict(_THINKING)))
        elif isinstance(block, ImageContentBlock):
            parts.append(aos.FilePart(file=_image_file(block.url)))
        else:
            parts.append(
                aos.DataPart(
                    data={
                        "toolCallId": block.tool_call_id,
                        "name": block.name,
                        "input": block.input,
                    },
                    metadata={"aap": "tool_use"},
                )
            )
    return parts or [aos.TextPart(text="")]


def _image_file(url: str) -> aos.FileContent:
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        mime = header[5:].split(";", 1)[0] or None
        return aos.FileContent(bytes=payload, mime_type=mime)
    return aos.FileContent(uri=url)


def parts_to_blocks(parts: list[aos.Part]) -> list[ContentBlock]:
    """Read (possibly guardian-modified) AOS parts back as AAP content blocks."""
    blocks: list[ContentBlock] = []
    for part in parts:
        if isinstance(part, aos.TextPart):
            if part.metadata and part.metadata.get("aap") == "thinking":
                blocks.append(ThinkingContentBlock(thinking=part.text))
            else:
                blocks.append(TextContentBlock(text=part.text))
        elif isinstance(part, aos.FilePart):
            file = part.file
            if file.uri is not None:
                blocks.append(ImageContentBlock(url=file.uri))
            elif file.bytes is not None and _is_base64(file.bytes):
                mime = file.mime_type or "application/octet-stream"
                blocks.append(ImageContentBlock(url=f"data:{mime};base64,{file.bytes}"))
        else:
            data = part.data
            if isinstance(data.get("input"), dict):
                blocks.append(
                    ToolUseContentBlock(
                        tool_call_id=str(data.get("toolCallId", "")),
                        name=str(data.get("name", "")),
                        input=data["input"],
                    )
                )
    return blocks


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def simplify(blocks: list[ContentBlock]) -> Content:
    """A lone text block reads as plain string content, as AAP's examples write it."""
    if len(blocks) == 1 and isinstance(blocks[0], TextContentBlock):
        return blocks[0].text
    return blocks


def outputs_of(content: Content) -> list[aos.TextPart]:
    """Tool result content as AOS text outputs (image blocks by their URL, tool_use blocks as
    their JSON, each marked): every block the model will read is in the request."""
    if isinstance(content, str):
        return [aos.TextPart(text=content)]
    outputs: list[aos.TextPart] = []
    for block in content:
        if isinstance(block, TextContentBlock):
            outputs.append(aos.TextPart(text=block.text))
        elif isinstance(block, ImageContentBlock):
            outputs.append(aos.TextPart(text=block.url, metadata={"aap": "image"}))
        elif isinstance(block, ThinkingContentBlock):
            outputs.append(aos.TextPart(text=block.thinking, metadata=dict(_THINKING)))
        else:
            outputs.append(
                aos.TextPart(text=msgspec.json.encode(block).decode(), metadata={"aap": "tool_use"})
            )
    return outputs


def content_of_outputs(outputs: list[aos.TextPart]) -> Content:
    """Read (possibly modified) AOS tool outputs back as AAP tool result content."""
    blocks: list[ContentBlock] = []
    for part in outputs:
        tag = part.metadata.get("aap") if part.metadata else None
        if tag == "image":
            blocks.append(ImageContentBlock(url=part.text))
        elif tag == "thinking":
            blocks.append(ThinkingContentBlock(thinking=part.text))
        elif tag == "tool_use":
            try:
                blocks.append(msgspec.json.decode(part.text, type=ToolUseContentBlock))
            except msgspec.ValidationError:  # rewritten beyond reading: keep it as text
                blocks.append(TextContentBlock(text=part.text))
        else:
            blocks.append(TextContentBlock(text=part.text))
    if all(isinstance(block, TextContentBlock) for block in blocks):
        return "\n".join(block.text for block in blocks if isinstance(block, TextContentBlock))
    return blocks


class StepFactory:
    """The AOS requests of one turn."""

    def __init__(
        self,
        *,
        agent: aos.Agent,
        session_id: str,
        turn_id: str,
        principal: Principal,
    ) -> None:
        self._agent = agent
        self._session = aos.Session(id=session_id)
        self._user = principal.aos_user
        self.turn_id = turn_id

    def _context(self) -> aos.StepContext:
        step_id, timestamp = new_stamped_id("step_")
        return aos.StepContext(
            agent=self._agent,
            session=self._session,
            turn_id=self.turn_id,
            step_id=step_id,
            timestamp=timestamp,
            user=self._user,
        )

    def message(
        self, role: str, content: Content, cited: list[KnowledgeItem] | None = None
    ) -> aos.MessageStep:
        context = self._context()
        message = aos.Message(
            # The step's own id under the message prefix: unique as the step's is, one id less.
            id="msg_" + context.step_id.removeprefix("step_"),
            role="user" if role == "user" else "agent",
            content=content_to_parts(content),
        )
        # AOS citations: the knowledge chunks the model was given (FileSource id = chunk id).
        citation: list[aos.Source] = [
            aos.FileSource(id=item.id, name=str((item.metadata or {}).get("source", item.id)))
            for item in cited or []
        ]
        params = aos.MessageParams(context=context, message=message, citation=citation)
        return aos.MessageStep(id=context.step_id, params=params)

    def tool_call_request(
        self, execution_id: str, name: str, arguments: dict[str, Any]
    ) -> aos.ToolCallRequestStep:
        context = self._context()
        request = aos.ToolCallRequest(
            execution_id=execution_id,
            tool_id=name,
            inputs=[
                aos.ToolArgumentValue(name=key, value=value) for key, value in arguments.items()
            ],
        )
        params = aos.ToolCallRequestParams(context=context, tool_call_request=request)
        return aos.ToolCallRequestStep(id=context.step_id, params=params)

    def tool_call_result(
        self, execution_id: str, content: Content, is_error: bool
    ) -> aos.ToolCallResultStep:
        context = self._context()
        result = aos.ToolCallResult(outputs=outputs_of(content), is_error=is_error)
        params = aos.ToolCallResultParams(context=context, execution_id=execution_id, result=result)
        return aos.ToolCallResultStep(id=context.step_id, params=params)

    def knowledge_retrieval(
        self, query: str, keywords: list[str] | None, items: list[KnowledgeItem]
    ) -> aos.KnowledgeRetrievalStep:
        context = self._context()
        knowledge = aos.KnowledgeRetrievalStepParams(
            query=query,
            keywords=keywords,
            results=[
                aos.KnowledgeRetrievalResult(
                    id=item.id,
                    content=item.content,
                    mime_type=item.mime_type,
                    metadata=item.metadata,
                )
                for item in items
            ],
        )
        params = aos.KnowledgeRetrievalParams(context=context, knowledge_step=knowledge)
        return aos.KnowledgeRetrievalStep(id=context.step_id, params=params)

    def memory_context(self, memory: list[str]) -> aos.MemoryContextRetrievalStep:
        context = self._context()
        params = aos.MemoryContextRetrievalParams(context=context, memory=memory)
        return aos.MemoryContextRetrievalStep(id=context.step_id, params=params)

    def memory_store(self, memory: list[str]) -> aos.MemoryStoreStep:
        context = self._context()
        params = aos.MemoryStoreParams(context=context, memory=memory)
        return aos.MemoryStoreStep(id=context.step_id, params=params)

    @staticmethod
    def mcp(message: dict[str, Any], direction: str) -> aos.McpMessage:
        params = aos.McpParams(message=message, reasoning=f"MCP message {direction}")
        return aos.McpMessage(id=new_id("step_"), params=params)

    @staticmethod
    def a2a(message: dict[str, Any], direction: str) -> aos.A2aMessage:
        params = aos.A2aParams(message=message, reasoning=f"A2A message {direction}")
        return aos.A2aMessage(id=new_id("step_"), params=params)

    def agent_trigger(self, trigger: aos.AgentTrigger) -> aos.AgentTriggerStep:
        context = self._context()
        params = aos.AgentTriggerParams(context=context, trigger=trigger)
        return aos.AgentTriggerStep(id=context.step_id, params=params)
