"""A streamed turn whose input cannot be stored is answered as before: the HTTP error, as
JSON, and no stream; nothing of the turn is stored and the session takes the next turn.
The input's write is deferred into the turn's next one (`runtime/turn.py`), so its failure
comes from the turn's task, after `start_turn` has returned."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from aap_server.config import Settings
from tests.conftest import KEYS, assert_error, harness

POISON = "please-fail-this-write"


def refuse_poison(db: Path) -> None:
    """SQLite itself refuses to store a message holding POISON (a disk that fails the write)."""
    with sqlite3.connect(db) as connection:
        connection.execute(
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON history_full "
            f"WHEN CAST(NEW.message AS TEXT) LIKE '%{POISON}%' "
            "BEGIN SELECT RAISE(ABORT, 'the disk refused the write'); END"
        )


@pytest.mark.parametrize("mode", ["delta", "message"])
async def test_an_input_that_cannot_be_stored_is_an_http_error_not_a_stream(
    tmp_path: Path, mode: str
) -> None:
    db = tmp_path / "aap.db"
    settings = Settings(db=str(db), api_keys=KEYS)
    async with harness(tmp_path, settings=settings) as h:
        session_id = await h.new_session()
        refuse_poison(db)
        url = f"/sessions/{session_id}/turns"
        body = {"stream": mode, "messages": [{"role": "user", "content": f"say {POISON}"}]}
        failed = await h.client.post(url, json=body)
        error = assert_error(failed, failed.status_code)
        assert 500 <= failed.status_code < 600, failed.text
        assert "disk refused" not in error["message"]  # no internals in the answer
        # Nothing of it stored; the session is free and takes the next turn.
        ok = await h.client.post(
            url, json={"stream": mode, "messages": [{"role": "user", "content": "hello"}]}
        )
        assert ok.status_code == 200, ok.text
        assert "event: turn_start" in ok.text
        assert "end_turn" in ok.text
        history = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        assert history.status_code == 200, history.text
        assert POISON not in history.text
        assert "hello" in history.text
