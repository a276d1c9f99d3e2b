"""The `aap-server` command, without starting a server (DESIGN "Decisions already taken":
with no keys configured the server runs open but only on loopback, and says so)."""

from __future__ import annotations

import json
from pathlib import Path

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
    """Replace the server's run: record its configuration instead of serving."""
    from aap_server.api.drain import DrainingServer

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
    monkeypatch.setenv("AAP_PORT", "7001")
    assert cli.main(["serve", "--config", str(config), "--db", str(tmp_path / "a.db")]) == 0
    assert no_uvicorn[-1]["port"] == 7001
    argv = ["serve", "--config", str(config), "--port", "7002", "--db", str(tmp_path / "a.db")]
    assert cli.main(argv) == 0
    assert no_uvicorn[-1]["port"] == 7002


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


# `audit verify` checks a database; it never creates an empty one where none was.
def test_audit_verify_of_a_missing_database_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nope.db"
    assert cli.main(["audit", "verify", "--db", str(missing)]) == 2
    assert "no such database file" in capsys.readouterr().err
    assert not missing.exists()
