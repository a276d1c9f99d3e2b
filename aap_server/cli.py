"""The `aap-server` command: `serve` the hosted agents, or write the `openapi` document."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from aap_server.config import ConfigError, Settings, is_loopback, load_settings

logger = logging.getLogger("aap_server")


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {name: getattr(args, name, None) for name in ("host", "port", "db")}
    if getattr(args, "allow_open", False):
        overrides["allow_open"] = True
    return load_settings(args.config, overrides=overrides)


def serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not settings.api_keys:
        if not is_loopback(settings.host) and not settings.allow_open:
            logger.error(
                "refusing to serve %s without API keys: anyone could use every session. "
                "Set AAP_API_KEYS, bind a loopback address, or pass --allow-open.",
                settings.host,
            )
            return 2
        logger.warning(
            "no API keys configured: the server is OPEN (every caller is the same principal). "
            "Set AAP_API_KEYS=KEY:USER_ID:ORG_ID to require keys."
        )

    import uvicorn

    from aap_server.api import create_app

    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
        access_log=False,
    )
    return 0


def export_openapi(args: argparse.Namespace) -> int:
    from aap_server.api import create_app
    from aap_server.api.openapi import finalize_openapi

    settings = load_settings(args.config, overrides={"db": ":memory:"})
    app = create_app(settings)
    document = finalize_openapi(app.openapi_schema.to_schema())
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aap-server", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve_parser = commands.add_parser("serve", help="serve every agent in agents/ over AAP v3")
    serve_parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve_parser.add_argument("--port", type=int, help="port (default 8000)")
    serve_parser.add_argument("--db", help="SQLite database file (default ./aap.db)")
    serve_parser.add_argument("--config", help="TOML configuration file")
    serve_parser.add_argument(
        "--allow-open",
        action="store_true",
        help="serve a non-loopback address without API keys (not recommended)",
    )
    serve_parser.set_defaults(handler=serve)

    openapi_parser = commands.add_parser("openapi", help="write the OpenAPI document")
    openapi_parser.add_argument("--output", default="openapi/openapi.json")
    openapi_parser.add_argument("--config", help="TOML configuration file")
    openapi_parser.set_defaults(handler=export_openapi)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except ConfigError as error:
        print(f"aap-server: {error}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
