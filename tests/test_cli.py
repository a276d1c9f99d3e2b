"""The `aap-server` command, without starting a server (DESIGN "Decisions already taken":
with no keys configured the server runs open but only on loopback, and says so)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from aap_server import cli
from aap_server.config import ApiKey, Settings

KEY = ApiKey(key="k", user_id="u", org_id="o")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AAP_* variable of the machine running the tests leaks into them."""
    import os

    for name in list(os.environ):
        if name.startswith("AAP_"):
            monkeypatch.delenv(name)


@pytest.fixture
def no_uvicorn(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Replace the server's run: record its configuration instead of serving (in this
    process: one worker, where the default would fork one per core)."""
    from aap_server.api.drain import DrainingServer

    monkeypatch.setenv("AAP_WORKERS", "1")
    calls: list[dict[str, object]] = []

    def fake_run(server: DrainingServer, sockets: object = None) -> None:
        config = server.config
        calls.append({"app": config.app, "host": config.host, "port": config.port})

    monkeypatch.setattr(DrainingServer, "run", fake_run)
    return calls


# DESIGN "Auth": no keys on a public address is refused with exit code 2 and a message.
def test_serve_on_a_public_address_without_keys_refuses_with_exit_code_2(
    capsys: pytest.CaptureFixture[str], no_uvicorn: list[dict[str, object]], tmp_path: Path
) -> None:
    code = cli.main(["serve", "--host", "0.0.0.0", "--db", str(tmp_path / "a.db")])
    assert code == 2
    err = capsys.readouterr().err
    assert "refusing to serve 0.0.0.0 without API keys" in err
    assert "--allow-open" in err
    assert "AAP_API_KEYS" in err
    assert no_uvicorn == []


@pytest.mark.parametrize(
    ("settings", "start", "says"),
    [
        (Settings(host="0.0.0.0"), False, "refusing"),
        (Settings(host="192.168.1.5"), False, "refusing"),
        (Settings(host="::"), False, "refusing"),
        (Settings(host="127.example.com"), False, "refusing"),  # a name, not an address
        (Settings(host="0.0.0.0", allow_open=True), True, "OPEN on 0.0.0.0"),
        (Settings(host="127.0.0.1"), True, "OPEN to local callers"),
        (Settings(host="127.0.0.2"), True, "OPEN to local callers"),
        (Settings(host="localhost"), True, "OPEN to local callers"),
        (Settings(host="::1"), True, "OPEN to local callers"),
        (Settings(host="0.0.0.0", api_keys=[KEY]), True, None),
        (Settings(host="127.0.0.1", api_keys=[KEY]), True, None),
    ],
)
def test_access_decision(settings: Settings, start: bool, says: str | None) -> None:
    decision = cli.decide_access(settings)
    assert decision.start is start
    if says is None:
        assert decision.message is None
    else:
        assert decision.message is not None
        assert says in decision.message


# `--allow-open` makes the same invocation start (uvicorn replaced by a recorder here).
def test_serve_with_allow_open_starts_and_warns(
    no_uvicorn: list[dict[str, object]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    argv = ["serve", "--host", "0.0.0.0", "--port", "8123", "--allow-open"]
    code = cli.main([*argv, "--db", str(tmp_path / "a.db")])
    assert code == 0
    (call,) = no_uvicorn
    assert call["host"] == "0.0.0.0"
    assert call["port"] == 8123
    assert "OPEN on 0.0.0.0" in caplog.text


# Flags win over the environment, which wins over the file.
def test_serve_flags_win_over_environment_and_file(
    no_uvicorn: list[dict[str, object]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "aap.toml"
    config.write_text('host = "127.0.0.1"\nport = 7000\napi_keys = "k:u:o"\n')

    def served_port() -> object:  # a call, so mypy keeps no narrowing from one check to the next
        return no_uvicorn[-1]["port"]

    monkeypatch.setenv("AAP_PORT", "7001")
    assert cli.main(["serve", "--config", str(config), "--db", str(tmp_path / "a.db")]) == 0
    assert served_port() == 7001
    argv = ["serve", "--config", str(config), "--port", "7002", "--db", str(tmp_path / "a.db")]
    assert cli.main(argv) == 0
    assert served_port() == 7002


# A configuration error is exit code 2 with a message naming the variable.
def test_bad_configuration_exits_2_naming_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AAP_API_KEYS", "only-a-key")
    assert cli.main(["serve", "--db", str(tmp_path / "a.db")]) == 2
    err = capsys.readouterr().err
    assert "AAP_API_KEYS" in err
    assert "only-a-key" not in err  # not even a malformed key is echoed


def test_missing_config_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["serve", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in capsys.readouterr().err


# `aap-server openapi` writes the document (the drift test compares it with the app).
def test_openapi_command_writes_the_document(tmp_path: Path) -> None:
    output = tmp_path / "out" / "openapi.json"
    assert cli.main(["openapi", "--output", str(output)]) == 0
    document = json.loads(output.read_text())
    assert document["openapi"].startswith("3.1")
    assert "/sessions/{session_id}/turns" in document["paths"]


# --- aap-server policy ------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_POLICY = ROOT / "aap_server" / "guardian" / "default_policy.toml"
CASES = ROOT / "examples" / "default_policy_cases.toml"


def test_policy_check_accepts_the_shipped_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["policy", "check", str(DEFAULT_POLICY)]) == 0
    assert "OK" in capsys.readouterr().out


def test_policy_check_refuses_a_broken_policy_naming_rule_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text('[[rules]]\nid = "r1"\naction = "deny"\nreason_code = "x"\nmatch.tool = 3\n')
    assert cli.main(["policy", "check", str(broken)]) == 2
    error = capsys.readouterr().err
    assert "r1" in error
    assert "match.tool" in error


def test_policy_test_runs_the_example_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["policy", "test", str(DEFAULT_POLICY), str(CASES)]) == 0
    assert "0 failed" in capsys.readouterr().out


def test_policy_test_fails_when_a_case_does_not_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = tmp_path / "cases.toml"
    example = CASES.read_text(encoding="utf-8")
    cases.write_text(example.replace('expect = "modify"', 'expect = "allow"', 1))
    assert cli.main(["policy", "test", str(DEFAULT_POLICY), str(cases)]) == 1
    assert "FAIL" in capsys.readouterr().out


# --- rough edges a newcomer hits (issue 11) ---------------------------------------------------


def run(*argv: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Any:
    """The real command in a child process (what a user types), without AAP_* of this machine."""
    clean = {name: value for name, value in os.environ.items() if not name.startswith("AAP_")}
    return subprocess.run(
        [sys.executable, "-m", "aap_server.cli", *argv],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env={**clean, **(env or {})},
        timeout=60,
        check=False,
    )


def test_version_prints_the_installed_version() -> None:
    done = run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"aap-server {version('aap-server')}\n"


def leaf_commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    names = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                names.extend(leaf_commands(sub, f"{prefix}{name} ") or [f"{prefix}{name}"])
    return names


def test_top_level_help_lists_every_command_and_sub_command() -> None:
    commands = leaf_commands(cli.build_parser())
    assert {"serve", "openapi", "policy check", "policy test"} <= set(commands)
    done = run("--help")
    assert done.returncode == 0
    listed = [line.split("  ")[1].strip() for line in done.stdout.splitlines() if "  " in line]
    for command in commands:
        assert command in listed, f"{command!r} missing from:\n{done.stdout}"
    assert "COMMAND" in done.stdout.splitlines()[0]  # usage


def test_openapi_to_standard_output_with_a_dash(tmp_path: Path) -> None:
    done = run("openapi", "--output", "-", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["openapi"].startswith("3.1")
    assert list(tmp_path.iterdir()) == []  # no file named "-"


def test_openapi_without_output_never_overwrites_the_repository_copy(tmp_path: Path) -> None:
    committed = tmp_path / "openapi" / "openapi.json"
    committed.parent.mkdir()
    committed.write_text("the committed copy\n")
    done = run("openapi", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert committed.read_text() == "the committed copy\n"
    assert "/sessions/{session_id}/turns" in json.loads(done.stdout)["paths"]


def readme_example_config() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"Example `aap.toml`:\n\n```toml\n(.*?)```", readme, re.S)
    assert block is not None, "README lost its example aap.toml"
    return block.group(1)


# The README's own example, as written, on a machine without /var/lib/aap: one line naming the
# setting and the path, exit code 2 (it was a 49-line traceback from inside start-up).
def test_readme_example_config_with_a_missing_database_directory_is_one_line(
    tmp_path: Path,
) -> None:
    example = readme_example_config()
    assert 'db = "/var/lib/aap/aap.db"' in example
    missing = tmp_path / "var" / "lib" / "aap" / "aap.db"
    config = tmp_path / "aap.toml"
    config.write_text(example.replace("/var/lib/aap/aap.db", str(missing)))
    done = run("serve", "--config", str(config))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"aap-server: db: {str(missing)!r}: directory ")
    assert "does not exist" in done.stderr
    assert not missing.parent.exists()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: d / "missing" / "aap.db", "does not exist"),
        (lambda d: d, "is a directory"),
        (lambda d: d / "notes.txt", "file is not a database"),
    ],
)
def test_an_unusable_database_path_is_a_configuration_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_uvicorn: list[dict[str, object]],
    make: Callable[[Path], Path],
    says: str,
) -> None:
    (tmp_path / "notes.txt").write_text("not a database, but precious\n" * 100)
    path = make(tmp_path)
    assert cli.main(["serve", "--db", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"db: {str(path)!r}" in err
    assert says in err
    assert no_uvicorn == []
    assert (tmp_path / "notes.txt").read_text() == "not a database, but precious\n" * 100


def test_a_usable_database_path_starts(tmp_path: Path, no_uvicorn: list[dict[str, object]]) -> None:
    assert cli.main(["serve", "--db", str(tmp_path / "new.db")]) == 0
    assert len(no_uvicorn) == 1


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("AAP_PORT", "eighty", "Expected `int`"),
        ("AAP_PORT", "70000", "between 1 and 65535"),
        ("AAP_LOG_LEVEL", "loud", "log_level must be one of"),
        ("AAP_PUBLIC_META", "maybe", "Expected `bool`"),
        ("AAP_TURN_TIMEOUT_SECONDS", "-5", "must be positive"),
        ("AAP_CORS_ORIGINS", "https://app.example/", "not an origin"),
        ("AAP_POLICY", "/nowhere/policy.toml", "cannot be read"),
    ],
)
def test_every_configuration_error_is_one_line_naming_setting_and_value(
    tmp_path: Path, variable: str, value: str, says: str
) -> None:
    done = run("serve", "--db", str(tmp_path / "a.db"), env={variable: value})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr  # no warning or traceback around it
    setting = variable.removeprefix("AAP_").lower()
    assert variable in done.stderr or f"{setting}:" in done.stderr, done.stderr
    assert value in done.stderr
    assert says in done.stderr


def test_policy_check_warns_about_tools_and_agents_no_hosted_agent_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "typos.toml"
    policy.write_text(
        '[egress]\ntools = ["send_emial", "http_*"]\n'
        '[[rules]]\nid = "no-mail"\naction = "deny"\nreason_code = "x"\n'
        'match.tool = ["send_mail", "calculator"]\n'
        '[[rules]]\nid = "demo-only"\naction = "deny"\nreason_code = "y"\n'
        'match.agent = ["dmeo"]\nmatch.tool = ["search_*"]\n'
    )
    assert cli.main(["policy", "check", str(policy)]) == 0  # warnings: client tools may exist
    captured = capsys.readouterr()
    assert "OK" in captured.out
    warnings = captured.err.splitlines()
    assert len(warnings) == 3, captured.err
    assert "egress.tools: 'send_emial' matches no tool" in warnings[0]
    assert "(id 'no-mail'): match.tool: 'send_mail' matches no tool" in warnings[1]
    assert "send_email" in warnings[1]  # the tools there are, to spot the typo
    assert "(id 'demo-only'): match.agent: 'dmeo' matches no agent" in warnings[2]
    assert "demo" in warnings[2]


def test_policy_check_of_the_shipped_policy_has_no_warnings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["policy", "check", str(DEFAULT_POLICY)]) == 0
    assert capsys.readouterr().err == ""


# `audit verify` checks a database; it never creates an empty one where none was.
def test_audit_verify_of_a_missing_database_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nope.db"
    assert cli.main(["audit", "verify", "--db", str(missing)]) == 2
    assert "no such database file" in capsys.readouterr().err
    assert not missing.exists()


# Issue 12: start-up objects are frozen out of the collector, young collections are rarer.
def test_serve_freezes_start_up_objects_and_raises_the_young_gc_threshold(
    no_uvicorn: list[dict[str, object]], tmp_path: Path
) -> None:
    import gc

    before = gc.get_threshold()
    try:
        assert cli.main(["serve", "--db", str(tmp_path / "a.db")]) == 0
        (call,) = no_uvicorn
        assert gc.get_threshold()[0] == cli.GC_GEN0_THRESHOLD
        assert gc.get_threshold()[1:] == before[1:]
        # The app built before serving is frozen: in no generation the collector scans.
        assert gc.get_freeze_count() > 0
        assert all(tracked is not call["app"] for tracked in gc.get_objects())
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
