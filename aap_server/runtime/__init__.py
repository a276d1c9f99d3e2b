"""The turn engine and AAP operations. Knows nothing of Litestar or HTTP."""

from aap_server.runtime.errors import (
    AapError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    UnavailableError,
)
from aap_server.runtime.events import AssistantText, EngineEvent, MessageOut
from aap_server.runtime.principal import LOCAL_PRINCIPAL, Principal
from aap_server.runtime.registry import AgentRegistry, HostedAgent
from aap_server.runtime.service import AapService, Turn
from aap_server.runtime.validation import RequestLimits
from aap_server.runtime.views import delta_view, message_view, none_view

__all__ = [
    "LOCAL_PRINCIPAL",
    "AapError",
    "AapService",
    "AgentRegistry",
    "AssistantText",
    "ConflictError",
    "EngineEvent",
    "HostedAgent",
    "InvalidRequestError",
    "MessageOut",
    "NotFoundError",
    "Principal",
    "RequestLimits",
    "Turn",
    "UnavailableError",
    "delta_view",
    "message_view",
    "none_view",
]
