"""`aap-server serve` on a PostgreSQL database it cannot use stops with one line naming where
the database is (host, port, database), never the password, and no traceback (issue 10)."""

from __future__ import annotations

import socket

from tests.postgres_cluster import PostgresCluster
from tests.test_cli import run


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port  # nothing listens on it once the probe is closed


def assert_one_line_naming(done: object, where: str) -> None:
    stderr: str = done.stderr  # type: ignore[attr-defined]
    assert done.returncode == 2, stderr  # type: ignore[attr-defined]
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "Traceback" not in stderr
    assert "pw-Zq8kLm2" not in stderr
    assert f"db: cannot use the PostgreSQL database at {where}" in stderr, stderr


def test_an_unreachable_database_is_one_line_naming_its_host() -> None:
    port = closed_port()
    dsn = f"postgresql://aap:pw-Zq8kLm2@127.0.0.1:{port}/aap"
    done = run(
        "serve", "--db", dsn, "--port", str(closed_port()), env={"AAP_DB_TIMEOUT_SECONDS": "3"}
    )
    assert_one_line_naming(done, f"127.0.0.1:{port}/aap")


def test_a_missing_database_is_one_line_naming_it(postgres_cluster: PostgresCluster) -> None:
    dsn = f"postgresql://aap:pw-Zq8kLm2@127.0.0.1:{postgres_cluster.port}/no_such_db"
    done = run("serve", "--db", dsn, "--port", str(closed_port()))
    assert_one_line_naming(done, f"127.0.0.1:{postgres_cluster.port}/no_such_db")
    assert "no_such_db" in done.stderr
