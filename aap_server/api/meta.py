"""The body of `GET /meta`: AAP's, plus this server's extension fields.

AAP v3 (`specs/aap/endpoints.md` § GET /meta) defines `version` and `agents` and says nothing
of other fields; its clients ignore unknown ones (the official client checks `version` only).
What this server offers beyond AAP is advertised under one top-level `extensions` object, each
entry named `aap-server/<extension>` so that it cannot collide with a field AAP may add:

    "extensions": {"aap-server/memories": {"path": "/memories", "agents": ["buddy"]}}

`path` is relative to the same base URL as `/meta`. The object is left out when the server
offers no extension (no agent keeps memory a principal can manage).
"""

from __future__ import annotations

import msgspec

from aap_server.api.memories import MemoriesController
from aap_server.protocol import GetMetaResponse as AapMetaResponse
from aap_server.protocol.base import Wire
from aap_server.runtime import AapService


class MemoriesExtension(Wire, frozen=True):
    """`GET {path}` lists the caller's long-term memories of these agents (newest first),
    `DELETE {path}/{id}` forgets one (README § Memory)."""

    path: str
    agents: list[str]


class MetaExtensions(Wire, frozen=True):
    memories: MemoriesExtension | None = msgspec.field(default=None, name="aap-server/memories")


class GetMetaResponse(AapMetaResponse, frozen=True):
    """AAP's `GetMetaResponse` (`version`, `agents`) and this server's `extensions`."""

    extensions: MetaExtensions | None = None


def meta_response(service: AapService) -> GetMetaResponse:
    aap = service.meta()
    with_memory = list(service.registry.memory_books())
    if not with_memory:
        return GetMetaResponse(version=aap.version, agents=aap.agents)
    memories = MemoriesExtension(path=MemoriesController.path, agents=with_memory)
    return GetMetaResponse(
        version=aap.version, agents=aap.agents, extensions=MetaExtensions(memories=memories)
    )
