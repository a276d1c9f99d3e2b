"""The app factory: the one place the concrete store and guardian are built and wired."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from litestar import Litestar
from litestar.datastructures import State

from aap_server import package_version
from aap_server.agent import Agent
from aap_server.api.a2a import get_a2a_agent_card, post_a2a
from aap_server.api.aos_endpoint import get_aos_audit, post_aos
from aap_server.api.auth import Authenticator
from aap_server.api.banner import log_banner
from aap_server.api.base_path import BasePathMount
from aap_server.api.console import console_routes
from aap_server.api.cors import CorsMiddleware
from aap_server.api.docs import docs_serving
from aap_server.api.drain import Drain
from aap_server.api.errors import EXCEPTION_HANDLERS
from aap_server.api.health import HealthCache, get_health
from aap_server.api.memories import MemoriesController
from aap_server.api.metrics import metrics_routes
from aap_server.api.observability import Observability, ObservabilityMiddleware
from aap_server.api.openapi import openapi_config
from aap_server.api.routes import SessionsController, admit_new_work, get_meta
from aap_server.api.turn_route import TurnRoute
from aap_server.config import ConfigError, Settings
from aap_server.guardian import Guardian
from aap_server.guardian.aom import AomGuardian
from aap_server.guardian.chain import ChainMember, GuardianChain
from aap_server.guardian.policy import Policy, default_policy, load_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.guardian.reload import PolicyReloader
from aap_server.guardian.remote import RemoteGuardian
from aap_server.runtime import AapService, AgentRegistry, RequestLimits
from aap_server.runtime.limits import PrincipalLimits
from aap_server.runtime.loading import load_agents
from aap_server.runtime.start_screen import screen_discovered_tools
from aap_server.store import SessionStore, StoreLimits
from aap_server.store.select import store_for_db
from aap_server.telemetry import Telemetry, provider_from_environment, tracer_of

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

logger = logging.getLogger("aap_server")

AUDIT_PRUNE_INTERVAL_SECONDS = 3600.0
"""How often expired audit entries are pruned (in the background, in small batches)."""
_DAY_MS = 86_400_000


async def prune_audit_forever(store: SessionStore, retention_days: float) -> None:
    """Drop audit chains of sessions deleted longer than the retention ago, and older POST /aos
    entries: at start, then every AUDIT_PRUNE_INTERVAL_SECONDS, a batch per transaction so
    turns' writes interleave (off the request path: no request pays for it)."""
    while True:
        try:
            cutoff = time.time_ns() // 1_000_000 - int(retention_days * _DAY_MS)
            while await store.prune_audit(cutoff):  # each batch awaits the database thread
                continue
        except Exception:
            logger.exception("pruning the audit trail failed; retrying later")
        await asyncio.sleep(AUDIT_PRUNE_INTERVAL_SECONDS)


def guardian_names(settings: Settings) -> list[str]:
    """The in-process guardian's name, then each configured remote's, in order. Not the
    URL's host: names show in the public health report and in verdicts."""
    remotes = enumerate(settings.guardians, start=1)
    return ["in-process"] + [remote.name or f"remote-{number}" for number, remote in remotes]


def with_remote_guardians(guardian: Guardian, settings: Settings) -> GuardianChain:
    """`guardian` first, then each configured remote guardian in order."""
    names = guardian_names(settings)
    members = [ChainMember(guardian, names[0], settings.guardian_timeout_seconds)]
    for name, remote in zip(names[1:], settings.guardians, strict=True):
        client = RemoteGuardian(
            remote.url, name=name, timeout_seconds=remote.timeout_seconds, api_key=remote.api_key
        )
        members.append(ChainMember(client, name, remote.timeout_seconds, remote.fail_open))
    return GuardianChain(members)


async def log_guardian_health(guardian: Guardian) -> None:
    """Ping every guardian at start: a remote that is down is loud in the log (fail-closed
    ones deny every step until they answer), but the server still starts."""
    for status in await guardian.health():
        if status.ok:
            logger.info("guardian %s: ok (%s)", status.name, status.detail or status.kind)
        else:
            outcome = "its steps are ALLOWED" if status.fail_open else "its steps are DENIED"
            logger.warning(
                "guardian %s is not answering (%s): until it does, %s",
                status.name,
                status.detail,
                outcome,
            )


class GuardianSetup(NamedTuple):
    guardian: Guardian
    # How long a step may wait for the whole chain of guardians.
    budget_seconds: float
    # The policy the in-process guardian loaded (None: a guardian was given), for the banner.
    policy: Policy | None
    # Reloads the policy file when it changes (None: no file, or a guardian was given).
    reloader: PolicyReloader | None


def assemble_guardian(settings: Settings, given: Guardian | None) -> GuardianSetup:
    """`given` (else the policy guardian the settings name), then the remote guardians, all
    under the AOM guardian that enforces AOM surfaces' automation_policy."""
    policy: Policy | None = None
    reloader: PolicyReloader | None = None
    guardian = given
    if guardian is None:
        policy = load_policy(settings.policy) if settings.policy else default_policy()
        policy_guardian = PolicyGuardian(policy)
        if settings.policy:
            reloader = PolicyReloader(policy_guardian, settings.policy)
        guardian = policy_guardian
    budget = settings.guardian_timeout_seconds
    if settings.guardians:
        chain = with_remote_guardians(guardian, settings)
        guardian, budget = chain, chain.budget_seconds
    return GuardianSetup(AomGuardian(guardian), budget, policy, reloader)


def create_app(
    settings: Settings,
    agents: Sequence[Agent] | None = None,
    *,
    store: SessionStore | None = None,
    guardian: Guardian | None = None,
    tracer_provider: TracerProvider | None = None,
    banner: bool = True,
) -> Litestar:
    """An ASGI app serving `agents` (default: those the settings name, see runtime/loading).
    Spans go to `tracer_provider`, else where the `OTEL_*` variables say (if anywhere).
    `banner`: log the start-up banner (`serve --workers N`: the first worker only)."""
    if agents is None:
        agents = load_agents(
            declared=settings.agents,
            modules=settings.agent_modules,
            use_entry_points=settings.entry_point_agents,
        )
    hosted_agents = list(agents)
    unknown = sorted(set(settings.a2a_agents) - {agent.name for agent in hosted_agents})
    if unknown:
        raise ConfigError(f"a2a_agents: no hosted agent is named {', '.join(unknown)}")
    store = store or store_for_db(
        settings.db,
        StoreLimits(
            max_sessions=settings.max_sessions,
            max_stored_bytes=settings.max_stored_bytes,
            caller_memory_bytes=settings.aos_memory_bytes_per_caller,
            caller_forgotten_sessions=settings.aos_forgotten_sessions_per_caller,
        ),
        pool_min=settings.db_pool_min,
        pool_max=settings.db_pool_max,
        timeout_seconds=settings.db_timeout_seconds,
        # Several processes (`serve` resolved `workers`): the turn lease lives in the file.
        shared_leases=settings.workers > 1,
    )
    principal_limits = PrincipalLimits(
        requests_per_second=settings.rate_limit_per_second,
        burst=settings.rate_limit_burst,
        max_concurrent_turns=settings.max_concurrent_turns,
        max_concurrent_aos_requests=settings.max_concurrent_aos_requests,
    )
    # One guardian: the turn engine's and POST /aos's.
    guardian, guardian_budget, policy, reloader = assemble_guardian(settings, guardian)
    app_version = package_version()
    own_provider = None
    if tracer_provider is None:
        tracer_provider = own_provider = provider_from_environment(app_version)
    tracer = tracer_of(tracer_provider, app_version) if tracer_provider is not None else None
    telemetry = Telemetry(app_version, tracer)
    service = AapService(
        registry=AgentRegistry(hosted_agents),
        store=store,
        guardian=guardian,
        guardian_timeout_seconds=guardian_budget,
        turn_timeout_seconds=settings.turn_timeout_seconds,
        approval_timeout_seconds=settings.approval_timeout_seconds,
        page_size=settings.page_size,
        refuse_modified_input=settings.refuse_modified_input,
        turn_lease_seconds=settings.turn_lease_seconds,
        session_cache_sessions=settings.session_cache_sessions,
        session_cache_bytes=settings.session_cache_bytes,
        limits=RequestLimits(
            max_messages=settings.max_messages_per_request,
            max_blocks_per_message=settings.max_blocks_per_message,
            max_tools=settings.max_tools_per_request,
            max_option_bytes=settings.max_option_bytes,
        ),
        telemetry=telemetry,
        principal_limits=principal_limits,
    )

    watcher: list[asyncio.Task[None]] = []
    drain = Drain(service, settings.shutdown_grace_seconds)

    async def open_store() -> None:
        await store.open()
        # Before serving: tools found outside (MCP servers' lists) pass the guardian first.
        await screen_discovered_tools(service.registry, service.guardian, store)
        if banner:
            log_banner(
                settings,
                hosted_agents,
                policy,
                guardian_names(settings),
                app_version,
                tracer is not None,
            )
        watcher.append(
            asyncio.create_task(prune_audit_forever(store, settings.audit_retention_days))
        )
        if settings.guardians:
            await log_guardian_health(guardian)
        if reloader is not None:
            watcher.append(asyncio.create_task(reloader.watch(settings.policy_poll_seconds)))
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not on every platform
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloader.reload)
        # Objects made at start-up live for the whole run: keep the GC from rescanning them
        # (measured: cuts the p99 tail under load; see DESIGN stack notes).
        gc.collect()
        gc.freeze()

    async def drain_and_close() -> None:
        for task in watcher:
            task.cancel()
        try:
            await service.shutdown(settings.shutdown_grace_seconds)
            await store.close()
        finally:
            if own_provider is not None:
                own_provider.shutdown()  # exports the spans still batched
            await guardian.close()
            for agent in hosted_agents:  # their models' connections (e.g. to an LLM endpoint)
                try:
                    await agent.model.aclose()
                    for close in agent.close_hooks:  # e.g. its MCP servers' connections
                        await close()
                except Exception:
                    logger.exception("closing agent %s failed", agent.name)

    app = Litestar(
        route_handlers=[
            get_meta,
            get_health,
            SessionsController,
            post_aos,
            get_aos_audit,
            MemoriesController,
            get_a2a_agent_card,
            post_a2a,
            *console_routes(settings),
            *metrics_routes(settings),
        ],
        on_startup=[open_store],
        on_shutdown=[drain_and_close],
        before_request=admit_new_work,  # the drain, then the JSON-values cap
        exception_handlers=EXCEPTION_HANDLERS,  # type: ignore[arg-type]
        openapi_config=openapi_config(app_version, **docs_serving(settings.base_path)),
        request_max_body_size=settings.max_body_bytes,
        # Logging is set up once by `aap-server serve` (telemetry/logs.py), not by Litestar,
        # whose default config would give its loggers and the root a format of its own.
        logging_config=None,
        state=State(
            {
                "settings": settings,
                "service": service,
                "health": HealthCache(guardian, settings.health_cache_seconds),
                "drain": drain,
                "limits": principal_limits,
                "version": app_version,  # AOS ping answers it
                "authenticator": Authenticator(settings.api_keys),
                "telemetry": telemetry,  # GET /metrics reads it
            }
        ),
    )
    if settings.base_path:
        app.asgi_handler = BasePathMount(app.asgi_handler, settings.base_path)
    if settings.cors_origins:
        # In front of routing (a preflight needs no key, an unknown path's 404 is readable).
        app.asgi_handler = CorsMiddleware(app.asgi_handler, settings.cors_origins)
    # Every request gets an id, a log line and its metrics, preflights included.
    observability = Observability(telemetry)
    app.asgi_handler = ObservabilityMiddleware(app.asgi_handler, observability)
    # Outermost: ordinary turns skip Litestar's per-request work and the middleware, and
    # make the observability calls themselves (api/turn_route.py).
    app.asgi_handler = TurnRoute(
        app.asgi_handler,
        service=service,
        settings=settings,
        authenticator=app.state.authenticator,
        limits=principal_limits,
        drain=drain,
        observability=observability,
    )
    return app
