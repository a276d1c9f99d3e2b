"""A throwaway PostgreSQL cluster, started by the test suite from the machine's binaries.

PostgreSQL refuses to run as root, so under root the cluster runs as `nobody` (through
`runuser`). It listens on a free loopback port only, with `trust` authentication, fsync off
(a test cluster need not survive a power cut) and its data in a fresh temporary directory
that goes when the session ends. Outside CI a machine without the binaries skips the
PostgreSQL tests with that reason; in CI (CI=true) it is an error, since .ci/run installs them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_SEARCH = ("/usr/lib/postgresql/17/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin")
SUPERUSER = "aap"


def _binaries() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    for folder in _SEARCH:
        if (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class PostgresCluster:
    bindir: Path
    datadir: Path
    port: int
    log: Path

    def _as_owner(self, *command: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "nobody", "--", *command]
        return list(command)

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        subprocess.run(
            self._as_owner(
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self.log),
                "-w",
                "-t",
                "60",
                "-o",
                f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
                " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
                " -c max_connections=200",
                "start",
            ),
            check=True,
            capture_output=True,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            self._as_owner(
                str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "stop"
            ),
            check=False,
            capture_output=True,
        )

    def restart(self) -> None:
        self.stop()
        self.start()

    def psql(self, sql: str, database: str = "postgres") -> str:
        done = subprocess.run(
            [
                str(self.bindir / "psql"),
                "-XqAt",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
                self.dsn(database),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout

    def new_database(self) -> str:
        """A fresh empty database; its DSN."""
        name = "t_" + uuid.uuid4().hex[:16]
        self.psql(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def database_for(self, folder: Path) -> str:
        """The DSN of the database that belongs to `folder` (a test's tmp_path), made the
        first time it is asked for: the PostgreSQL twin of a database file in that folder."""
        marker = folder / ".postgres-dsn"
        if not marker.exists():
            marker.write_text(self.new_database())
        return marker.read_text()


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    bindir = _binaries()
    if bindir is None:
        reason = "PostgreSQL binaries (initdb, pg_ctl) not found; apt-get install postgresql"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI installs them in .ci/run)")
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="aap-pg-"))
    try:
        datadir = root / "data"
        datadir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(root, "nobody")
            shutil.chown(datadir, "nobody")
        cluster = PostgresCluster(bindir, datadir, _free_port(), root / "postgres.log")
        subprocess.run(
            cluster._as_owner(
                str(bindir / "initdb"),
                "-D",
                str(datadir),
                "-U",
                SUPERUSER,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ),
            check=True,
            capture_output=True,
        )
        log = root / "postgres.log"
        log.touch()
        if os.geteuid() == 0:
            shutil.chown(log, "nobody")
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop("immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)
