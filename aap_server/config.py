"""Settings: defaults, then a TOML file, then `AAP_*` environment variables (env wins)."""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from aap_server.toolkits.llm import LlmAgentSpec


class ApiKey(msgspec.Struct, frozen=True, kw_only=True):
    """One API key and the principal it stands for."""

    key: str
    user_id: str
    org_id: str

    def __post_init__(self) -> None:
        if not self.key or any(c.isspace() for c in self.key):
            raise ValueError("a key must be non-empty and hold no whitespace")
        for name in ("user_id", "org_id"):
            value = getattr(self, name)
            # ':' separates organisation and user in the owner key sessions are stored under.
            if not value or ":" in value:
                raise ValueError(f"{name} must be non-empty and hold no ':'")

    def __repr__(self) -> str:  # never print the key itself
        return f"ApiKey(user_id={self.user_id!r}, org_id={self.org_id!r}, key='***')"

    __str__ = __repr__

    def __rich_repr__(self) -> list[tuple[str, Any]]:  # msgspec's default shows `key`
        return [("user_id", self.user_id), ("org_id", self.org_id), ("key", "***")]


class RemoteGuardianSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One remote AOS guardian, asked after the in-process policy (see guardian/chain.py)."""

    url: str
    # How verdicts and health name it; default `remote-N` (its place in the list).
    name: str = ""
    timeout_seconds: float = 1.0
    # Let steps through while it cannot answer (default: deny them, i.e. fail closed).
    fail_open: bool = False
    # Sent as `Authorization: Bearer`; never shown.
    api_key: str = ""

    def __post_init__(self) -> None:
        parsed = urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError("url must be an http:// or https:// URL with a host")
        if parsed.username or parsed.password:
            raise ValueError("url must not carry credentials; use api_key")
        if self.timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")

    def __repr__(self) -> str:  # never print the key itself
        return (
            f"RemoteGuardianSettings(url={self.url!r}, name={self.name!r}, "
            f"timeout_seconds={self.timeout_seconds!r}, fail_open={self.fail_open!r}, "
            f"api_key={'***' if self.api_key else ''!r})"
        )

    __str__ = __repr__

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return [("url", self.url), ("name", self.name), ("api_key", "***")]


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8000
    # A SQLite file (one process), or a postgresql:// URL that several replicas share.
    db: str = "./aap.db"
    # PostgreSQL only: connections each replica keeps open (at least / at most), how long
    # taking a connection or one statement may take, and how long a turn's lease on its
    # session lasts unrenewed (a replica that dies mid-turn frees the session after it).
    db_pool_min: int = 2
    db_pool_max: int = 10
    db_timeout_seconds: float = 10.0
    turn_lease_seconds: float = 30.0
    # `serve`: server processes sharing the listening socket and the database (0, the
    # default: one per usable core; one for `:memory:`). With a SQLite file and more than
    # one, the turn lease is kept in the file.
    workers: int = 0
    # Sessions each process keeps in memory after a turn on them, so the next turn there
    # does not read them back (least recently used go first): at most this many, and this
    # many bytes in all (as stored: compacted history, agent state, guardian memory). 0: off.
    session_cache_sessions: int = 10_000
    session_cache_bytes: int = 64 * 1024 * 1024
    api_keys: list[ApiKey] = msgspec.field(default_factory=list)
    # Serve GET /meta without a key (AAP allows capability discovery in public).
    public_meta: bool = True
    # Run without API keys on a non-loopback address anyway (everyone is one principal).
    allow_open: bool = False
    page_size: int = 20
    # GET /sessions/:id/history: the largest `limit` (and the messages read per store page
    # when the whole history is streamed), and the stored bytes of messages a page holds
    # (at least one message).
    history_page_messages: int = 1000
    history_page_bytes: int = 1024 * 1024
    max_body_bytes: int = 10 * 1024 * 1024
    sse_ping_seconds: float = 15.0
    guardian_timeout_seconds: float = 2.0
    turn_timeout_seconds: float = 300.0
    # How long a permission request (tool_call + stopReason tool_use) waits for its answer.
    approval_timeout_seconds: float = 3600.0
    shutdown_grace_seconds: float = 30.0
    # GET /health pings the guardians at most this often; callers in between share the answer.
    health_cache_seconds: float = 10.0
    # How long a deleted session's audit chain, and POST /aos callers' entries, are kept.
    audit_retention_days: float = 90.0
    # Per principal (API key; an open server is one principal). 0: no limit.
    rate_limit_per_second: float = 100.0
    rate_limit_burst: int = 500
    max_concurrent_turns: int = 16
    max_concurrent_aos_requests: int = 8
    max_sessions: int = 10_000
    max_stored_bytes: int = 1024**3
    # Per POST /aos caller: bytes of guardian session memory kept in the store (least
    # recently written sessions go first), and sessions pushed out while tainted remembered
    # by id (past that, every session of the caller with no memory stored counts as tainted).
    aos_memory_bytes_per_caller: int = 16 * 1024 * 1024
    aos_forgotten_sessions_per_caller: int = 50_000
    log_level: str = "info"
    # Every log line (ours, uvicorn's) as one JSON object, or a readable console line.
    log_format: Literal["json", "console"] = "console"
    # Who may scrape GET /metrics: `key` (any API key, like the API), `public`, `off`.
    metrics_auth: Literal["key", "public", "off"] = "key"
    # The guardian's policy file (TOML); empty: the policy that ships with the server.
    policy: str = ""
    # How often the policy file is checked for changes (it is also reloaded on SIGHUP).
    policy_poll_seconds: float = 2.0
    # What one request may carry (README "Limits"): messages (seed or turn), content blocks
    # per message, client tool definitions, bytes per option value.
    max_messages_per_request: int = 1000
    max_blocks_per_message: int = 100
    max_tools_per_request: int = 128
    max_option_bytes: int = 4096
    # JSON values (array items, object members) in one `POST /aos`, `POST /sessions` or turn
    # body, counted before it is decoded: decoding holds the event loop ~0.3 µs a value.
    max_json_values_per_request: int = 100_000
    # A guardian `modify` of client input refuses it instead, and refused input is not stored
    # (README "History": keeps raw sensitive input out of storage; `full` is exact otherwise).
    refuse_modified_input: bool = False
    # Remote AOS guardians asked after the in-process policy, in order.
    guardians: list[RemoteGuardianSettings] = msgspec.field(default_factory=list)
    # Browser origins allowed to call the API (CORS), e.g. `https://app.example.com`; `*`:
    # any. Empty: CORS off (browsers on other origins are refused).
    cors_origins: list[str] = msgspec.field(default_factory=list)
    # Serve every endpoint (and the docs) under this path, e.g. `/v1`; empty: at the root.
    base_path: str = ""
    # Agents declared with no code, served by the `llm` agent kind (README § Host a real agent).
    agents: list[LlmAgentSpec] = msgspec.field(default_factory=list)
    # Python agents to serve: `package.module:ATTRIBUTE` (an Agent, a list of them or a
    # function returning either; the attribute defaults to AGENT).
    agent_modules: list[str] = msgspec.field(default_factory=list)
    # Serve the agents installed packages register under the `aap_server.agents` entry point
    # group (the bundled demo agent is one).
    entry_point_agents: bool = True
    # Hosted agents other A2A agents may call (README § A2A): each at `/a2a/<name>`, its card
    # at `/a2a/<name>/.well-known/agent-card.json`, authenticated like the rest of the API.
    a2a_agents: list[str] = msgspec.field(default_factory=list)
    # The built-in browser console at /console; "auto": only when `host` is a loopback address.
    console: bool | Literal["auto"] = "auto"

    def worker_processes(self) -> int:
        """How many processes `serve` runs: `workers`, or for 0 one per usable core (one for
        an in-memory database, which no second process could see)."""
        if self.workers:
            return self.workers
        return 1 if self.db == ":memory:" else len(os.sched_getaffinity(0))

    def __post_init__(self) -> None:
        for name in (
            "page_size",
            "history_page_messages",
            "history_page_bytes",
            "max_body_bytes",
            "max_messages_per_request",
            "max_blocks_per_message",
            "max_tools_per_request",
            "max_option_bytes",
            "max_json_values_per_request",
            "rate_limit_burst",
            "db_pool_max",
            "aos_memory_bytes_per_caller",
            "aos_forgotten_sessions_per_caller",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in (
            "rate_limit_per_second",
            "max_concurrent_turns",
            "max_concurrent_aos_requests",
            "max_sessions",
            "max_stored_bytes",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (no limit) or more")
        for name in (
            "sse_ping_seconds",
            "guardian_timeout_seconds",
            "turn_timeout_seconds",
            "approval_timeout_seconds",
            "shutdown_grace_seconds",
            "health_cache_seconds",
            "audit_retention_days",
            "policy_poll_seconds",
            "db_timeout_seconds",
            "turn_lease_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in ("session_cache_sessions", "session_cache_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (no cache) or more")
        if self.workers < 0:
            raise ValueError("workers must be 0 (one per core) or more")
        if self.db == ":memory:" and self.worker_processes() > 1:
            raise ValueError("workers: an in-memory database cannot be shared; use 1 or a file")
        if not 0 <= self.db_pool_min <= self.db_pool_max:
            raise ValueError("db_pool_min must be between 0 and db_pool_max")
        if not 0 < self.port < 65536:
            raise ValueError("port must be between 1 and 65535")
        if self.log_level.lower() not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
        keys = [api_key.key for api_key in self.api_keys]
        if len(set(keys)) != len(keys):
            raise ValueError("api_keys lists the same key twice")
        names = [guardian.name for guardian in self.guardians if guardian.name]
        if len(set(names)) != len(names):
            raise ValueError("guardians names the same guardian twice")
        if self.base_path and not re.fullmatch(r"(/[A-Za-z0-9._~-]+)+", self.base_path):
            raise ValueError(
                "base_path must be empty or start with / and hold path segments of letters, "
                "digits and . _ ~ -, with no trailing / (e.g. /v1)"
            )
        for origin in self.cors_origins:
            if not is_origin(origin):
                raise ValueError(
                    f"cors_origins: {origin!r} is not an origin: expected `*` or "
                    "scheme://host[:port] with no path (e.g. https://app.example.com)"
                )


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the setting."""


# Environment variable -> setting name. Every setting has one.
ENV_VARS = {f"AAP_{name.upper()}": name for name in Settings.__struct_fields__}


def parse_api_keys(text: str, source: str) -> list[ApiKey]:
    """`KEY:USER_ID:ORG_ID,KEY2:USER2:ORG2` (whitespace around entries is ignored)."""
    keys: list[ApiKey] = []
    for index, entry in enumerate(part.strip() for part in text.split(",")):
        if not entry:
            continue
        fields = entry.split(":")
        if len(fields) != 3 or not all(fields):
            raise ConfigError(
                f"{source}: entry {index + 1} must be KEY:USER_ID:ORG_ID with no empty part"
            )
        try:
            keys.append(ApiKey(key=fields[0], user_id=fields[1], org_id=fields[2]))
        except ValueError as error:
            raise ConfigError(f"{source}: entry {index + 1}: {error}") from error
    return keys


def parse_guardians(text: str, source: str) -> list[dict[str, Any]]:
    """`URL,URL2` (each fail-closed with the default timeout), or a JSON array of objects
    with the `[[guardians]]` fields for anything more."""
    text = text.strip()
    if text.startswith("["):
        return parse_json_array(text, source)
    return [{"url": url} for url in comma_list(text)]


def comma_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated environment value, stripped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def convert_agents(entries: Any, where: str, environ: Mapping[str, str]) -> list[LlmAgentSpec]:
    """`[[agents]]` tables as specs with their API keys read from the environment; an error
    names the agent and the field (`aap.toml: agents[1] ('helper'): temperature: …`)."""
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: expected a list of agent tables ([[agents]])")
    specs: list[LlmAgentSpec] = []
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        label = f"{where}[{index}]" + (f" ({name!r})" if isinstance(name, str) else "")
        try:
            spec = msgspec.convert(entry, LlmAgentSpec, strict=False)
            specs.append(spec.with_key_from(environ))
        except ValueError as error:
            text = str(error)
            at = re.search(r" - at `\$\.?([^`]*)`$", text)
            if at:
                text = f"{at[1]}: {text[: at.start()]}" if at[1] else text[: at.start()]
            raise ConfigError(f"{label}: {text}") from error
    return specs


def parse_json_array(text: str, source: str) -> list[Any]:
    try:
        entries = msgspec.json.decode(text)
    except msgspec.DecodeError as error:
        raise ConfigError(f"{source}: not valid JSON: {error}") from error
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: expected a JSON array")
    return entries


def load_settings(
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Defaults < TOML file < environment < explicit overrides (command-line flags)."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    source: dict[str, str] = {}  # setting -> where its value came from, for error messages
    if config_file is not None:
        path = Path(config_file)
        try:
            with path.open("rb") as handle:
                raw.update(tomllib.load(handle))
        except FileNotFoundError as error:
            raise ConfigError(f"config file {path} does not exist") from error
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"config file {path}: {error}") from error
        if isinstance(raw.get("api_keys"), str):
            raw["api_keys"] = parse_api_keys(raw["api_keys"], f"{path}: api_keys")
        if "agents" in raw:
            raw["agents"] = convert_agents(raw["agents"], f"{path}: agents", environ)
        source.update({name: f"{path}: {name}" for name in raw})
        source[""] = str(path)
    for variable, name in ENV_VARS.items():
        if variable in environ:
            value: Any = environ[variable]
            if name == "api_keys":
                value = parse_api_keys(value, variable)
            elif name == "guardians":
                value = parse_guardians(value, variable)
            elif name == "agents":
                value = convert_agents(parse_json_array(value, variable), variable, environ)
            elif name in ("cors_origins", "agent_modules", "a2a_agents"):
                value = comma_list(value)
            raw[name] = value
            source[name] = variable
    for name, value in (overrides or {}).items():
        if value is not None:
            raw[name] = value
            source[name] = f"--{name.replace('_', '-')}"
    try:
        # strict=False lets "8000" and "true" from the environment convert.
        return msgspec.convert(raw, Settings, strict=False)
    except ValueError as error:  # msgspec.ValidationError is a ValueError too
        raise ConfigError(_describe(error, source, raw)) from error


_AT_FIELD = re.compile(r" - at `\$\.(\w+)([^`]*)`")
# Settings whose values may hold keys: an error names them, never echoes them.
_NOT_ECHOED = {"api_keys", "guardians"}


def _describe(error: ValueError, source: Mapping[str, str], raw: Mapping[str, Any]) -> str:
    """The error on one line, led by where the offending value came from, and naming the
    value (`AAP_PORT: Expected `int`, got `str` (value: 'abc')`)."""
    text = " ".join(str(error).split())
    at = _AT_FIELD.search(text)
    if at:
        field: str | None = at[1]
        # Inside a list or table, say where: `guardians[1].url: …`
        text = f"{at[1]}{at[2]}: {text[: at.start()]}" if at[2] else text[: at.start()]
    else:  # our own checks start with the setting's name
        field = next((n for n in Settings.__struct_fields__ if text.startswith(n)), None)
    if field is None:
        # e.g. an unknown key in the file (the environment has no unknown settings)
        return f"{source.get('', 'configuration')}: {text}"
    if field in raw and field not in _NOT_ECHOED and "cors_origins" not in text:
        text = f"{text} (value: {raw[field]!r})"
    where = source.get(field, field)
    return text if where == field else f"{where}: {text}"


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine only (a name other than `localhost` is
    not trusted to resolve to loopback: `127.example.com` is anyone's)."""
    host = host.strip().strip("[]").lower()
    if host in {"localhost", "localhost."}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_origin(text: str) -> bool:
    """`*`, or what a browser sends as `Origin`: scheme://host[:port], nothing after it."""
    if text == "*":
        return True
    try:
        parsed = urlsplit(text)
        parsed.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return False
    return (
        parsed.scheme in ("http", "https")
        and bool(parsed.hostname)
        and f"{parsed.scheme}://{parsed.netloc}" == text
        and not (parsed.username or parsed.password)
        and "*" not in parsed.netloc  # no partial wildcards: list each origin, or `*` alone
    )
