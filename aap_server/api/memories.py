"""Extension endpoints (not AAP): a principal lists and deletes its agents' long-term memory."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, delete, get
from litestar.di import NamedDependency, Provide
from litestar.params import Parameter
from litestar.status_codes import HTTP_204_NO_CONTENT

from aap_server.api.auth import provide_principal, require_principal
from aap_server.api.openapi import ERROR_RESPONSES
from aap_server.runtime import AapService, Principal
from aap_server.toolkits.memory import MemoryRecord

Caller = NamedDependency[Principal]
MemoryId = Annotated[str, Parameter(description="A memory's id from GET /memories")]


class GetMemoriesResponse(msgspec.Struct, frozen=True):
    memories: list[MemoryRecord]


def _service(request: Request[Any, Any, Any]) -> AapService:
    service: AapService = request.app.state.service
    return service


class MemoriesController(Controller):
    """What agents with `memory = true` remember of the caller (an aap-server extension)."""

    path = "/memories"
    tags = ["memories (extension)"]  # noqa: RUF012
    guards = [require_principal]  # noqa: RUF012
    dependencies = {"principal": Provide(provide_principal)}  # noqa: RUF012
    security = [{"bearer": []}]  # noqa: RUF012

    @get(summary="List your memories", responses=ERROR_RESPONSES(400, 401))
    async def list_memories(
        self,
        request: Request[Any, Any, Any],
        principal: Caller,
        agent: Annotated[
            str | None, Parameter(description="Only this agent's", max_length=64)
        ] = None,
    ) -> GetMemoriesResponse:
        """What the agents remember of the caller, newest first."""
        records = await _service(request).registry.list_memories(principal, agent)
        return GetMemoriesResponse(memories=records)

    @delete(
        "/{memory_id:str}",
        summary="Delete one of your memories",
        status_code=HTTP_204_NO_CONTENT,
        responses=ERROR_RESPONSES(401, 404),
    )
    async def delete_memory(
        self, request: Request[Any, Any, Any], principal: Caller, memory_id: MemoryId
    ) -> None:
        """Forget one memory; another principal's memory is a 404."""
        await _service(request).registry.delete_memory(principal, memory_id)
