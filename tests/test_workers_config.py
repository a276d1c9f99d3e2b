"""The `workers` setting of `serve` (issue 12): its default, its limits, its error messages."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from aap_server import cli
from aap_server.config import ConfigError, load_settings


def test_one_worker_per_usable_core_by_default_and_an_explicit_count_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AAP_WORKERS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert load_settings(None).worker_processes() == cores
    monkeypatch.setenv("AAP_WORKERS", "0")
    assert load_settings(None).worker_processes() == cores
    monkeypatch.setenv("AAP_WORKERS", "1")
    assert load_settings(None).worker_processes() == 1
    assert load_settings(None, overrides={"workers": 3}).worker_processes() == 3


def test_an_in_memory_database_runs_one_worker_by_default_without_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AAP_WORKERS", raising=False)
    # Pretend a machine of 4 cores: the default must still not ask for 4 in-memory databases.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert load_settings(None, overrides={"db": ":memory:"}).worker_processes() == 1
    assert load_settings(None, overrides={"db": str(Path("a.db"))}).worker_processes() == 4


def test_serve_on_an_in_memory_database_serves_one_worker_in_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aap_server.api.drain import DrainingServer

    monkeypatch.delenv("AAP_WORKERS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    served: list[int] = []
    # Serving is replaced by a record of the app it would serve (the real run is e2e).
    monkeypatch.setattr(
        DrainingServer, "run", lambda server, sockets=None: served.append(os.getpid())
    )
    assert cli.main(["serve", "--db", ":memory:"]) == 0
    assert served == [os.getpid()]  # no fork


def test_a_negative_count_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AAP_WORKERS", "-1")
    with pytest.raises(ConfigError, match="workers must be 0"):
        load_settings(None)


def test_an_in_memory_database_takes_one_worker_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["serve", "--db", ":memory:", "--workers", "2"]) == 2
    assert "in-memory database cannot be shared" in capsys.readouterr().err


def test_a_port_in_use_is_exit_code_2_before_any_worker_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--db", str(tmp_path / "a.db"), "--workers", "2", "--port", str(port)]
        assert cli.main(argv) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
