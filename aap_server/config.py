"""Settings: defaults, then a TOML file, then `AAP_*` environment variables (env wins)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec


class ApiKey(msgspec.Struct, frozen=True, kw_only=True):
    """One API key and the principal it stands for."""

    key: str
    user_id: str
    org_id: str

    def __repr__(self) -> str:  # never print the key itself
        return f"ApiKey(user_id={self.user_id!r}, org_id={self.org_id!r}, key='***')"


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    host: str = "127.0.0.1"
    port: int = 8000
    db: str = "./aap.db"
    api_keys: list[ApiKey] = msgspec.field(default_factory=list)
    # Serve GET /meta without a key (AAP allows capability discovery in public).
    public_meta: bool = True
    # Run without API keys on a non-loopback address anyway (everyone is one principal).
    allow_open: bool = False
    page_size: int = 20
    max_body_bytes: int = 10 * 1024 * 1024
    sse_ping_seconds: float = 15.0
    guardian_timeout_seconds: float = 2.0
    turn_timeout_seconds: float = 300.0
    shutdown_grace_seconds: float = 30.0
    log_level: str = "info"

    def __post_init__(self) -> None:
        for name in ("page_size", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in (
            "sse_ping_seconds",
            "guardian_timeout_seconds",
            "turn_timeout_seconds",
            "shutdown_grace_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0 < self.port < 65536:
            raise ValueError("port must be between 1 and 65535")


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
        keys.append(ApiKey(key=fields[0], user_id=fields[1], org_id=fields[2]))
    return keys


def load_settings(
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Defaults < TOML file < environment < explicit overrides (command-line flags)."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
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
    for variable, name in ENV_VARS.items():
        if variable in environ:
            value: Any = environ[variable]
            if name == "api_keys":
                value = parse_api_keys(value, variable)
            raw[name] = value
    raw.update({key: value for key, value in (overrides or {}).items() if value is not None})
    try:
        # str_values=True lets "8000" and "true" from the environment convert.
        return msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as error:
        raise ConfigError(f"configuration: {error}") from error
    except ValueError as error:
        raise ConfigError(f"configuration: {error}") from error


def is_loopback(host: str) -> bool:
    return host in {"localhost", "::1"} or host.startswith("127.")
