"""The `aap-server` command: serve AI agents behind AAP v3, every step guarded over AOS 0.1."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import socket
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from aap_server import package_version
from aap_server.config import ConfigError, Settings, is_loopback, load_settings
from aap_server.guardian.policy import PolicyError
from aap_server.runtime.loading import AgentLoadError
from aap_server.store.select import is_postgres

if TYPE_CHECKING:
    import uvicorn
    from litestar import Litestar

    from aap_server.agent import Agent
    from aap_server.guardian.policy import Policy

logger = logging.getLogger("aap_server")


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {name: getattr(args, name, None) for name in ("host", "port", "db", "workers")}
    if getattr(args, "allow_open", False):
        overrides["allow_open"] = True
    return load_settings(args.config, overrides=overrides)


class AccessDecision(NamedTuple):
    """Whether `serve` may start with these settings, and what to tell the operator."""

    start: bool
    message: str | None  # why it refuses, or the start-up warning; None: nothing to say


def decide_access(settings: Settings) -> AccessDecision:
    """DESIGN "Auth": with no keys the server runs open, but only on loopback unless the
    operator insists (`--allow-open` / `AAP_ALLOW_OPEN`); either way it says so."""
    if settings.api_keys:
        return AccessDecision(start=True, message=None)
    if not is_loopback(settings.host):
        if not settings.allow_open:
            return AccessDecision(
                start=False,
                message=f"refusing to serve {settings.host} without API keys: anyone who can "
                "reach it could use every session. Set AAP_API_KEYS=KEY:USER_ID:ORG_ID, bind a "
                "loopback address, or pass --allow-open.",
            )
        return AccessDecision(
            start=True,
            message=f"no API keys configured and --allow-open given: the server is OPEN on "
            f"{settings.host} to anyone who can reach it (every caller is the same principal).",
        )
    return AccessDecision(
        start=True,
        message="no API keys configured: the server is OPEN to local callers (every caller is "
        "the same principal). Set AAP_API_KEYS=KEY:USER_ID:ORG_ID to require keys.",
    )


DB_HELP = "SQLite database file (default ./aap.db) or a postgresql:// URL"


def check_database(path: str) -> None:
    """The SQLite file at `path` can be opened for writing (created if missing), or a
    ConfigError naming `db` and the path: found before serving, not as a traceback from
    inside the server's start-up."""
    if path == ":memory:" or is_postgres(path):  # PostgreSQL: checked when the store opens
        return
    file = Path(path)
    problem = None
    if file.is_dir():
        problem = f"is a directory; give a file in it, e.g. {file / 'aap.db'}"
    elif not file.parent.is_dir():
        problem = f"directory {file.parent} does not exist; create it or choose another path"
    elif not os.access(file.parent, os.W_OK | os.X_OK):
        # Also for an existing file: SQLite writes its -wal and -shm files beside it.
        problem = f"directory {file.parent} is not writable by this user"
    elif file.exists() and not os.access(file, os.R_OK | os.W_OK):
        problem = "is not readable and writable by this user"
    else:
        try:
            with contextlib.closing(sqlite3.connect(file, timeout=1)) as db:
                db.execute("BEGIN IMMEDIATE")  # reads the header: is it a database at all?
                db.execute("ROLLBACK")
        except sqlite3.Error as error:
            if getattr(error, "sqlite_errorname", "") != "SQLITE_BUSY":  # busy: it is usable
                problem = f"cannot be opened for writing: {error}"
    if problem is not None:
        raise ConfigError(f"db: {path!r}: {problem}")


def check_postgres(settings: Settings) -> None:
    """The PostgreSQL database answers and its schema is usable (migrated if need be), or a
    ConfigError of one line naming the DSN's host, port and database, never its password:
    found before serving, not as a traceback from inside the server's start-up."""
    import asyncio

    from aap_server.store.postgres import dsn_location, scrubbed
    from aap_server.store.select import store_for_db

    store = store_for_db(
        settings.db, pool_min=1, pool_max=1, timeout_seconds=settings.db_timeout_seconds
    )

    async def probe() -> None:
        await store.open()
        await store.close()

    try:
        asyncio.run(probe())
    except Exception as error:
        raise ConfigError(
            f"db: cannot use the PostgreSQL database at {dsn_location(settings.db)}: "
            f"{scrubbed(error, settings.db)}"
        ) from None


def prepare_shared_sqlite(path: str) -> None:
    """Open the SQLite file once before the workers do: WAL mode and migrations are applied
    here, by one process. Workers opening a fresh file at the same instant could each try to
    switch it to WAL, and SQLite refuses one of them at once (SQLITE_BUSY, no waiting)."""
    import asyncio

    from aap_server.store.select import store_for_db

    store = store_for_db(path)

    async def prepare() -> None:
        await store.open()
        await store.close()

    try:
        asyncio.run(prepare())
        # Leases left by workers of a previous run that was killed (no worker of this file
        # runs yet: one `serve` per database file): their turns are gone, so their sessions
        # are free now, not once `turn_lease_seconds` lapse.
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as connection, connection:
            connection.execute("DELETE FROM turn_leases")
    except Exception as error:
        raise ConfigError(f"db: {path!r}: {error}") from None


# Young-generation collections every this many allocations (Python's default: 700). A turn
# allocates thousands of short-lived, acyclic objects that reference counting frees; at 700
# the collector ran several times per turn and scanned them for nothing (bench/README).
GC_GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Once the app is built: what start-up made (modules, policy, detectors, agents) is
    moved out of the collector's sight for good (`gc.freeze`), and young collections run less
    often. Cycles are still collected."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def uvicorn_config(app: Litestar, settings: Settings) -> uvicorn.Config:
    """How `serve` runs `app` under uvicorn (tests/e2e/test_one_write.py serves with it)."""
    import uvicorn

    from aap_server.api.turn_route import served

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        # Turns have drained by the time uvicorn shuts down (see api/drain.py): what is
        # left is connections finishing their last bytes.
        timeout_graceful_shutdown=max(1, int(settings.shutdown_grace_seconds)),
        access_log=False,  # ours has the request id (api/observability.py)
        log_config=None,  # keep the one format configure_logging set up
        # httptools: api/one_write.py answers a turn in one write on its response cycle.
        http="httptools",
        proxy_headers=False,  # applied by the app `served` gives, with the same trusted hosts
    )
    config.app = served(app, config.forwarded_allow_ips)
    return config


def serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    # The count resolved once (0: one per core): each worker's app sees how many there are.
    settings = msgspec.structs.replace(settings, workers=settings.worker_processes())
    decision = decide_access(settings)
    if not decision.start:
        print(f"aap-server: {decision.message}", file=sys.stderr)
        return 2
    check_database(settings.db)
    if is_postgres(settings.db):
        check_postgres(settings)
    elif settings.workers > 1:
        prepare_shared_sqlite(settings.db)
    if settings.policy:  # a broken policy file is a configuration error, before any log line
        from aap_server.guardian.policy import load_policy

        try:
            load_policy(settings.policy)
        except PolicyError as error:
            raise ConfigError(f"policy: {error}") from error
    from aap_server.telemetry import TracingError, configure_logging

    secrets = [key.key for key in settings.api_keys] + [g.api_key for g in settings.guardians]
    configure_logging(settings.log_level, settings.log_format, secrets)
    if decision.message:
        logger.warning(decision.message)

    from aap_server.api import create_app
    from aap_server.api.drain import DrainingServer

    # Big guardian scans run in a worker thread; each time the event loop gives up the GIL
    # (at every I/O wait) it must wait up to this long for it back. Python's 5 ms default
    # made small turns wait behind an attacker's scans; 1 ms bounds that hand-off.
    sys.setswitchinterval(0.001)

    def run(sockets: list[socket.socket] | None = None, banner: bool = True) -> None:
        try:
            app = create_app(settings, banner=banner)
        except TracingError as error:
            raise ConfigError(str(error)) from error
        config = uvicorn_config(app, settings)  # its app frozen with the rest
        tune_gc()
        DrainingServer(config, app.state.drain).run(sockets)

    workers = settings.workers
    if workers == 1:
        run()
        return 0
    from aap_server.api.workers import bind, run_workers
    from aap_server.telemetry import provider_from_environment

    try:  # a tracing set-up every worker would refuse: said once, before any starts
        provider = provider_from_environment(package_version())
    except TracingError as error:
        raise ConfigError(str(error)) from error
    if provider is not None:
        provider.shutdown()  # its export thread must not be running across the fork
    try:
        listener = bind(settings.host, settings.port)
    except OSError as error:
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port}: {error}") from error

    def run_worker(sock: socket.socket, number: int) -> None:
        try:
            run([sock], banner=number == 1)  # one banner, not one per worker
        except ConfigError as error:  # e.g. an agent that fails to load: each worker's own
            print(f"aap-server: {error}", file=sys.stderr)
            raise SystemExit(2) from error

    return run_workers(run_worker, listener, workers)


def export_openapi(args: argparse.Namespace) -> int:
    from aap_server.api import create_app
    from aap_server.api.openapi import finalize_openapi

    settings = load_settings(args.config, overrides={"db": ":memory:"})
    app = create_app(settings)
    document = finalize_openapi(app.openapi_schema.to_schema())
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output}", file=sys.stderr)
    return 0


def unknown_names(policy: Policy, agents: list[Agent]) -> list[str]:
    """Warnings for names in `policy` that no hosted agent has: a typo there makes a rule
    match nothing, silently."""
    from aap_server.toolkits.builtin_tools import BUILTIN_TOOLS

    agent_names = sorted(agent.name for agent in agents)
    # Built-in tools (`aom_invoke`, ...) are real names too: any declared agent can enable them.
    tool_names = sorted({tool.name for agent in agents for tool in agent.tools} | {*BUILTIN_TOOLS})
    # An MCP server's tools, screened at start, are names too (all of them, served or not).
    tool_names += sorted(n for agent in agents for d in agent.discovered_tools for n in d.names)
    known = {"agent": agent_names, "tool": tool_names}
    warnings = []

    def check(where: str, kind: str, patterns: list[str]) -> None:
        for pattern in patterns:
            if any(c in pattern for c in "*?["):
                continue  # a pattern is meant for whatever tools come (the shipped `http_*`)
            if pattern not in known[kind]:
                listed = ", ".join(known[kind]) or "none"
                warnings.append(
                    f"{where}: {pattern!r} matches no {kind} of the hosted agents "
                    f"({kind}s: {listed})"
                )

    check("egress.tools", "tool", policy.egress.tools)
    for index, rule in enumerate(policy.rules):
        where = f"rules[{index}] (id {rule.id!r})"
        check(f"{where}: match.agent", "agent", rule.match.agent or [])
        check(f"{where}: match.tool", "tool", rule.match.tool or [])
    return warnings


def policy_check(args: argparse.Namespace) -> int:
    from aap_server.guardian.policy import load_policy
    from agents import discover

    policy = load_policy(args.file)
    for warning in unknown_names(policy, discover()):
        # A warning, not an error: tools a client declares in a turn are not known here.
        print(f"{args.file}: warning: {warning}", file=sys.stderr)
    enabled = sum(rule.enabled for rule in policy.rules)
    print(f"{args.file}: OK ({enabled} rules enabled, mode {policy.mode}, sha256 {policy.hash})")
    return 0


def policy_test(args: argparse.Namespace) -> int:
    from aap_server.guardian.policy import load_policy
    from aap_server.guardian.policy_cases import load_cases, run_cases

    results = run_cases(load_policy(args.file), load_cases(args.cases))
    for result in results:
        mark = "ok  " if result.passed else "FAIL"
        by = f" ({result.rule})" if result.rule else ""
        detail = f" — {result.detail}" if result.detail else ""
        print(f"{mark} {result.name}: {result.got}{by}{detail}")
    failed = sum(not result.passed for result in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def audit_verify(args: argparse.Namespace) -> int:
    """Check every audit hash chain; exit 1 naming each chain that breaks and where."""
    import asyncio

    from aap_server.store.select import store_for_db
    from aap_server.store.verify import verify_store

    settings = _settings(args)
    if (
        settings.db != ":memory:"
        and not is_postgres(settings.db)
        and not Path(settings.db).is_file()
    ):
        print(f"aap-server: {settings.db}: no such database file", file=sys.stderr)
        return 2

    async def run() -> tuple[int, int, int]:
        chains = entries = broken = 0
        store = store_for_db(settings.db)
        await store.open()
        try:
            async for report in verify_store(store):
                chains += 1
                entries += report.entries
                if report.broken_at is not None:
                    broken += 1
                    print(
                        f"BROKEN {report.chain} (owner {report.owner}): entry seq "
                        f"{report.broken_at} {report.problem} "
                        f"({report.entries} entries before it hold)"
                    )
        finally:
            await store.close()
        return chains, entries, broken

    chains, entries, broken = asyncio.run(run())
    print(f"{chains} chains, {entries} entries verified, {broken} broken")
    return 1 if broken else 0


Commands = argparse._SubParsersAction  # what `add_subparsers` returns


def command_summary(commands: Commands[argparse.ArgumentParser], prefix: str = "") -> list[str]:
    """One line per command, sub-commands included (`policy check`), read from the parser so
    that a new command is listed in the top-level help without anyone remembering to."""
    helps = {action.dest: action.help for action in commands._choices_actions}
    lines: list[str] = []
    for name, parser in commands.choices.items():
        nested = [action for action in parser._actions if isinstance(action, Commands)]
        if nested:
            lines.extend(command_summary(nested[0], f"{prefix}{name} "))
        else:
            lines.append(f"  {prefix + name:<16} {helps.get(name) or ''}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aap-server",
        usage="%(prog)s [-h] [--version] COMMAND ...",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"aap-server {package_version()}")
    # The commands are listed in the epilog (with sub-commands), not in argparse's own list.
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS
    )

    serve_parser = commands.add_parser("serve", help="serve the configured agents over AAP v3")
    serve_parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve_parser.add_argument("--port", type=int, help="port (default 8000)")
    serve_parser.add_argument("--db", help=DB_HELP)
    serve_parser.add_argument("--config", help="TOML configuration file")
    serve_parser.add_argument(
        "--workers",
        type=int,
        help="server processes on one socket and database (default 0: one per core; "
        "1 for :memory:)",
    )
    serve_parser.add_argument(
        "--allow-open",
        action="store_true",
        help="serve a non-loopback address without API keys (not recommended)",
    )
    serve_parser.set_defaults(handler=serve)

    openapi_parser = commands.add_parser("openapi", help="print or write the OpenAPI document")
    openapi_parser.add_argument(
        "--output",
        default="-",
        help="file to write (default -: standard output; the repository's copy is "
        "openapi/openapi.json)",
    )
    openapi_parser.add_argument("--config", help="TOML configuration file")
    openapi_parser.set_defaults(handler=export_openapi)

    audit_parser = commands.add_parser("audit", help="check the audit trail")
    audit_commands = audit_parser.add_subparsers(dest="audit_command", required=True)
    verify_parser = audit_commands.add_parser(
        "verify", help="check every audit hash chain (exit 1 if one breaks)"
    )
    verify_parser.add_argument("--db", help=DB_HELP)
    verify_parser.add_argument("--config", help="TOML configuration file")
    verify_parser.set_defaults(handler=audit_verify)

    policy_parser = commands.add_parser("policy", help="check or test a guardian policy file")
    policy_commands = policy_parser.add_subparsers(dest="policy_command", required=True)
    check_parser = policy_commands.add_parser("check", help="validate a policy file")
    check_parser.add_argument("file")
    check_parser.set_defaults(handler=policy_check)
    test_parser = policy_commands.add_parser("test", help="run policy unit cases")
    test_parser.add_argument("file")
    test_parser.add_argument("cases", help="TOML file of [[cases]]")
    test_parser.set_defaults(handler=policy_test)
    parser.epilog = "commands:\n" + "\n".join(command_summary(commands))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except (ConfigError, PolicyError, AgentLoadError) as error:
        print(f"aap-server: {error}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
