"""Settings: defaults < TOML file < AAP_* environment < overrides (command-line flags);
errors name where the bad value came from; API keys never appear in repr or str."""

from __future__ import annotations

from pathlib import Path

import pytest

from aap_server.config import ApiKey, ConfigError, Settings, load_settings, parse_api_keys

SECRET = "sk-very-secret-key"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "aap.toml"
    path.write_text(text)
    return path


def test_defaults_without_file_or_environment() -> None:
    settings = load_settings(environ={})
    assert settings == Settings()
    assert settings.host == "127.0.0.1"
    assert settings.page_size == 20
    assert settings.public_meta is True
    assert settings.api_keys == []


def test_file_then_environment_then_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'host = "127.0.0.2"\nport = 9000\npage_size = 5\npublic_meta = false\ndb = "file.db"\n',
    )
    from_file = load_settings(path, environ={})
    assert (from_file.host, from_file.port, from_file.page_size) == ("127.0.0.2", 9000, 5)
    assert from_file.public_meta is False

    env = {"AAP_PORT": "9001", "AAP_PUBLIC_META": "true", "AAP_SSE_PING_SECONDS": "2.5"}
    with_env = load_settings(path, environ=env)
    assert with_env.port == 9001  # env wins over the file
    assert with_env.public_meta is True
    assert with_env.sse_ping_seconds == 2.5
    assert with_env.page_size == 5  # untouched by env: the file's value

    flags = load_settings(path, environ=env, overrides={"port": 9002, "db": None})
    assert flags.port == 9002  # flags win over env
    assert flags.db == "file.db"  # a flag left unset (None) does not override


def test_every_setting_has_an_environment_variable() -> None:
    from aap_server.config import ENV_VARS

    assert set(ENV_VARS.values()) == set(Settings.__struct_fields__)
    assert all(name.startswith("AAP_") and name.isupper() for name in ENV_VARS)


def test_api_keys_from_the_environment() -> None:
    settings = load_settings(environ={"AAP_API_KEYS": " k1:alice:acme , k2:bob:acme,, "})
    assert settings.api_keys == [
        ApiKey(key="k1", user_id="alice", org_id="acme"),
        ApiKey(key="k2", user_id="bob", org_id="acme"),
    ]


def test_api_keys_from_the_file_as_string_or_tables(tmp_path: Path) -> None:
    as_string = load_settings(write(tmp_path, 'api_keys = "k1:alice:acme"\n'), environ={})
    assert as_string.api_keys == [ApiKey(key="k1", user_id="alice", org_id="acme")]
    tables = '[[api_keys]]\nkey = "k2"\nuser_id = "bob"\norg_id = "acme"\n'
    as_tables = load_settings(write(tmp_path, tables), environ={})
    assert as_tables.api_keys == [ApiKey(key="k2", user_id="bob", org_id="acme")]


@pytest.mark.parametrize(
    "value",
    [
        "justakey",
        "k:alice",
        "k:alice:acme:extra",
        ":alice:acme",
        "k::acme",
        "k:alice:",
        "good:a:b,bad",
        f"{SECRET}:alice:acme,{SECRET}:bob:acme",  # the same key twice
        "k k:alice:acme",  # whitespace inside a key
    ],
)
def test_malformed_api_keys_error_names_the_variable_not_the_key(value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(environ={"AAP_API_KEYS": value})
    message = str(raised.value)
    assert message.startswith("AAP_API_KEYS")
    assert SECRET not in message


def test_parse_api_keys_names_the_entry() -> None:
    with pytest.raises(ConfigError, match=r"SRC: entry 2 must be KEY:USER_ID:ORG_ID"):
        parse_api_keys("a:b:c,nope", "SRC")


def test_user_and_org_ids_cannot_hold_the_owner_separator(tmp_path: Path) -> None:
    # "acme:alice" + "x" and "acme" + "alice:x" would otherwise be one owner.
    tables = '[[api_keys]]\nkey = "k"\nuser_id = "alice:x"\norg_id = "acme"\n'
    with pytest.raises(ConfigError, match="user_id"):
        load_settings(write(tmp_path, tables), environ={})


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"AAP_PORT": "eighty"}, "AAP_PORT"),
        ({"AAP_PORT": "70000"}, "AAP_PORT"),
        ({"AAP_PAGE_SIZE": "0"}, "AAP_PAGE_SIZE"),
        ({"AAP_MAX_BODY_BYTES": "-1"}, "AAP_MAX_BODY_BYTES"),
        ({"AAP_PUBLIC_META": "perhaps"}, "AAP_PUBLIC_META"),
        ({"AAP_TURN_TIMEOUT_SECONDS": "0"}, "AAP_TURN_TIMEOUT_SECONDS"),
        ({"AAP_LOG_LEVEL": "chatty"}, "AAP_LOG_LEVEL"),
        ({"AAP_RATE_LIMIT_PER_SECOND": "-1"}, "AAP_RATE_LIMIT_PER_SECOND"),
        ({"AAP_RATE_LIMIT_BURST": "0"}, "AAP_RATE_LIMIT_BURST"),
        ({"AAP_MAX_CONCURRENT_TURNS": "-1"}, "AAP_MAX_CONCURRENT_TURNS"),
        ({"AAP_MAX_SESSIONS": "-5"}, "AAP_MAX_SESSIONS"),
        ({"AAP_MAX_STORED_BYTES": "-1"}, "AAP_MAX_STORED_BYTES"),
        ({"AAP_AUDIT_RETENTION_DAYS": "0"}, "AAP_AUDIT_RETENTION_DAYS"),
        ({"AAP_HEALTH_CACHE_SECONDS": "0"}, "AAP_HEALTH_CACHE_SECONDS"),
    ],
)
def test_invalid_environment_value_error_names_the_variable(
    env: dict[str, str], names: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(environ=env)
    assert str(raised.value).startswith(names)


def test_invalid_file_value_error_names_the_file_and_setting(tmp_path: Path) -> None:
    path = write(tmp_path, 'port = "x"\n')
    with pytest.raises(ConfigError) as raised:
        load_settings(path, environ={})
    assert str(raised.value).startswith(f"{path}: port")


def test_unknown_setting_in_the_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "prot = 8000\n")
    with pytest.raises(ConfigError, match="prot") as raised:
        load_settings(path, environ={})
    assert str(path) in str(raised.value)


def test_invalid_override_error_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--port"):
        load_settings(environ={}, overrides={"port": 0})


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist"):
        load_settings(tmp_path / "missing.toml", environ={})
    with pytest.raises(ConfigError, match=r"aap\.toml"):
        load_settings(write(tmp_path, "port = [unclosed\n"), environ={})


# DESIGN "Decisions": secrets never logged; the keys are masked in every printable form.
def test_api_keys_never_appear_in_repr_or_str() -> None:
    settings = load_settings(environ={"AAP_API_KEYS": f"{SECRET}:alice:acme"})
    key = settings.api_keys[0]
    for text in (
        repr(settings),
        str(settings),
        f"{settings}",
        repr([settings]),
        repr(key),
        str(key),
    ):
        assert SECRET not in text
        assert "alice" in text
    rich = list(key.__rich_repr__())
    assert SECRET not in repr(rich)


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.port = 1  # type: ignore[misc]


# --- remote guardians ---------------------------------------------------------------------------


def test_remote_guardians_from_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
[[guardians]]
url = "https://dlp.internal/aos"
name = "dlp"
timeout_seconds = 0.5
api_key = "{SECRET}"

[[guardians]]
url = "http://127.0.0.1:9000/aos"
fail_open = true
""",
    )
    first, second = load_settings(path, environ={}).guardians
    assert (first.name, first.timeout_seconds, first.fail_open) == ("dlp", 0.5, False)
    assert first.api_key == SECRET
    assert (second.url, second.fail_open, second.timeout_seconds) == (
        "http://127.0.0.1:9000/aos",
        True,
        1.0,
    )
    assert SECRET not in repr(load_settings(path, environ={}))


def test_remote_guardians_from_the_environment_as_urls_or_json() -> None:
    plain = load_settings(environ={"AAP_GUARDIANS": "http://a:1/aos, https://b/aos"})
    assert [g.url for g in plain.guardians] == ["http://a:1/aos", "https://b/aos"]
    assert not any(g.fail_open for g in plain.guardians)
    detailed = load_settings(
        environ={"AAP_GUARDIANS": '[{"url": "http://a/aos", "fail_open": true, "name": "a"}]'}
    )
    assert [(g.name, g.fail_open) for g in detailed.guardians] == [("a", True)]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("ftp://x/aos", "AAP_GUARDIANS: guardians[0]: url must be an http:// or https:// URL"),
        ("http://user:pw@x/aos", "guardians[0]: url must not carry credentials"),
        ('[{"url": "http://x", "timeout_seconds": 0}]', "timeout_seconds must be positive"),
        ('[{"url": "http://x", "timeout": 1}]', "guardians[0]: Object contains unknown field"),
        ("[not json", "AAP_GUARDIANS: not valid JSON"),
        (
            '[{"url": "http://x", "name": "a"}, {"url": "http://y", "name": "a"}]',
            "guardians names the same guardian twice",
        ),
    ],
)
def test_bad_remote_guardian_settings_name_the_entry_and_field(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match="AAP_GUARDIANS") as raised:
        load_settings(environ={"AAP_GUARDIANS": value})
    assert message in str(raised.value)
    assert "pw" not in str(raised.value)


def test_cors_origins_from_the_environment_and_the_file(tmp_path: Path) -> None:
    env = {"AAP_CORS_ORIGINS": " https://a.example , http://localhost:5173,, "}
    assert load_settings(environ=env).cors_origins == ["https://a.example", "http://localhost:5173"]
    path = write(tmp_path, 'cors_origins = ["*"]\n')
    assert load_settings(path, environ={}).cors_origins == ["*"]
    assert Settings().cors_origins == []  # off by default


@pytest.mark.parametrize(
    "origin",
    [
        "https://a.example/",  # a trailing slash: browsers never send one, it would never match
        "https://a.example/app",
        "a.example",
        "ftp://a.example",
        "https://user:pw@a.example",
        "https://a.example:port",
        "https://*.example",
    ],
)
def test_a_cors_origin_that_no_browser_sends_is_refused_naming_it(origin: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(environ={"AAP_CORS_ORIGINS": origin})
    message = str(error.value)
    assert message.startswith("AAP_CORS_ORIGINS: cors_origins:")
    assert repr(origin) in message


@pytest.mark.parametrize("base_path", ["v1", "/v1/", "/", "/v 1", "/v1//x", "/v1?x", "/ä"])
def test_a_malformed_base_path_is_refused_naming_it(base_path: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_settings(environ={"AAP_BASE_PATH": base_path})
    message = str(error.value)
    assert message.startswith("AAP_BASE_PATH: base_path must")
    assert repr(base_path) in message


def test_base_path_from_the_environment() -> None:
    assert load_settings(environ={"AAP_BASE_PATH": "/api/v1"}).base_path == "/api/v1"
    assert Settings().base_path == ""


# Issue 7 (LLM10): every limit is on by default, and 0 turns one off.
def test_limits_are_on_by_default_and_zero_turns_them_off() -> None:
    defaults = load_settings(environ={})
    assert defaults.rate_limit_per_second > 0
    assert defaults.max_concurrent_turns > 0
    assert defaults.max_sessions > 0
    assert defaults.max_stored_bytes > 0
    off = load_settings(environ={"AAP_MAX_SESSIONS": "0", "AAP_RATE_LIMIT_PER_SECOND": "0"})
    assert (off.max_sessions, off.rate_limit_per_second) == (0, 0)


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"AAP_DB_POOL_MIN": "5", "AAP_DB_POOL_MAX": "4"}, "db_pool_min"),
        ({"AAP_DB_POOL_MAX": "0"}, "db_pool_max"),
        ({"AAP_DB_TIMEOUT_SECONDS": "0"}, "db_timeout_seconds"),
        ({"AAP_TURN_LEASE_SECONDS": "-1"}, "turn_lease_seconds"),
    ],
)
def test_database_pool_and_lease_settings_are_checked(environ: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_settings(None, environ=environ)


def test_a_postgresql_url_passes_the_start_up_database_check() -> None:
    from aap_server.cli import check_database

    check_database("postgresql://aap@127.0.0.1:5432/aap")  # checked when the store opens
