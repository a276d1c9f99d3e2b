"""The start-up banner: one log line saying what this server serves and where."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Sequence

from aap_server.agent import Agent
from aap_server.config import Settings
from aap_server.guardian import native
from aap_server.guardian.policy import Policy

logger = logging.getLogger("aap_server")


def public_url(settings: Settings) -> str:
    """The bound address as a browser would reach it (`0.0.0.0` and `::` as localhost)."""
    host = settings.host
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        if address.is_unspecified:
            host = "localhost"
        elif address.version == 6:
            host = f"[{address}]"
    return f"http://{host}:{settings.port}{settings.base_path}"


def log_banner(
    settings: Settings,
    agents: Sequence[Agent],
    policy: Policy | None,
    guardians: Sequence[str],
    version: str,
    tracing: bool,
) -> None:
    url = public_url(settings)
    agent_names = ", ".join(agent.name for agent in agents) or "none"
    if policy is not None:
        source = settings.policy or "built-in default"
        policy_text = f"{source} (sha256 {policy.hash[:12]}, mode {policy.mode})"
    else:
        policy_text = "none (a guardian given by the embedding code)"
    metrics = (
        "off" if settings.metrics_auth == "off" else f"{url}/metrics ({settings.metrics_auth})"
    )
    logger.info(
        "aap-server %s on %s | agents: %s | policy: %s | guardians: %s (%s) | database: %s | "
        "docs: %s/schema | metrics: %s | tracing: %s",
        version,
        url,
        agent_names,
        policy_text,
        ", ".join(guardians),
        native.active(),  # pure Python: installed without a C compiler (slower, same verdicts)
        settings.db,
        url,
        metrics,
        "on" if tracing else "off",
        extra={
            "version": version,
            "bind": f"{settings.host}:{settings.port}",
            "agents": [agent.name for agent in agents],
            "policy_hash": policy.hash if policy is not None else None,
            "policy_mode": policy.mode if policy is not None else None,
            "guardian_primitives": native.active(),
            "database": settings.db,
            "docs_url": f"{url}/schema",
        },
    )
