"""A log line costs no lookup its line does not print: the caller's file, line and function,
the thread and the process (three lines a turn, each once a third of the turn's logging)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from aap_server.telemetry import configure_logging


@pytest.fixture
def restored() -> Iterator[None]:
    root = logging.getLogger()
    kept = list(root.handlers), root.level
    knobs = ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing")
    before = {name: getattr(logging, name) for name in knobs}
    try:
        yield
    finally:
        root.handlers[:] = kept[0]
        root.setLevel(kept[1])
        for name, value in before.items():
            setattr(logging, name, value)


def test_a_line_is_made_without_caller_thread_or_process_lookups(
    restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logger = logging.getLogger("aap_server.turn")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    configure_logging("info", "json", ["secret-key"])
    logging.getLogger().addHandler(Keep())
    logger.info("turn %s stopped: %s", "turn_1", "end_turn", extra={"turn_id": "turn_1"})
    (record,) = records
    assert record.funcName == "(unknown function)"  # no stack walk for the caller
    assert record.threadName is None
    assert record.processName is None
    line = json.loads(capsys.readouterr().err.splitlines()[-1])
    # The line says what it said before.
    assert line["message"] == "turn turn_1 stopped: end_turn"
    assert line["turn_id"] == "turn_1"
    assert line["logger"] == "aap_server.turn"
    assert "funcName" not in line
    assert "threadName" not in line
