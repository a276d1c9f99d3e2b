"""The server's own request ids (a request without a usable X-Request-ID gets one)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import harness


# Issue 12: fresh request ids are time-ordered ids (not uuid4s, a fifth of the cost): unique,
# plain tokens a client may send back as its X-Request-ID, sorting as the requests came.
async def test_fresh_request_ids_are_unique_plain_and_in_request_order(tmp_path: Path) -> None:
    async with harness(tmp_path) as h:
        given = [(await h.client.get("/meta")).headers["x-request-id"] for _ in range(12)]
        assert len(set(given)) == len(given)
        assert given == sorted(given)
        assert all(request_id.isalnum() for request_id in given)
        echoed = await h.client.get("/meta", headers={"X-Request-ID": given[0]})
        assert echoed.headers["x-request-id"] == given[0]
