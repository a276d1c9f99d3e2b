"""`POST /sessions` and turns refuse a body of more JSON values than
`max_json_values_per_request` before it is decoded (issue 7: a 10 MB body of tiny content
blocks held the event loop ~1 s in the decoder), with one 413 JSON error naming the setting on
the lean and the declared turn route alike; a body at the cap is served as before."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from aap_server.config import Settings
from tests.conftest import KEYS, app_harness, assert_error, harness

CAP = 1000
BLOCK = {"type": "text", "text": "hi"}  # an object, two members: five values with its `,`


def values(body: dict[str, Any]) -> int:
    """What `json_values_within` counts: each `[`, `{`, `,` and `:` (no strings hold one)."""
    encoded = msgspec.json.encode(body)
    return sum(encoded.count(c) for c in (b"[", b"{", b",", b":"))


def blocks(count: int) -> list[dict[str, str]]:
    return [BLOCK] * count


def seeded(messages: int) -> dict[str, Any]:
    seed = [{"role": "user", "content": blocks(2)} for _ in range(messages)]
    return {"agent": {"name": "demo"}, "messages": seed}


def turn(count: int, stream: str) -> dict[str, Any]:
    return {"stream": stream, "messages": [{"role": "user", "content": blocks(count)}]}


def assert_over_cap(response: Any) -> None:
    error = assert_error(response, 413, "too_many_json_values")
    assert f"more than {CAP} JSON values" in error["message"]
    assert "max_json_values_per_request" in error["message"]
    assert error["details"] == {"limit": CAP, "setting": "max_json_values_per_request"}


async def test_seed_messages_and_turns_over_the_cap_are_refused_undecoded(
    tmp_path: Path,
) -> None:
    settings = Settings(
        db=str(tmp_path / "aap.db"),
        api_keys=KEYS,
        max_json_values_per_request=CAP,
        max_blocks_per_message=1000,
    )
    async with harness(tmp_path, settings=settings) as h:
        # POST /sessions: ~90 seed messages at the cap are created, ~110 are refused.
        under = next(n for n in range(200, 0, -1) if values(seeded(n)) <= CAP)
        created = await h.client.post("/sessions", json=seeded(under))
        assert created.status_code == 201, created.text
        assert values(seeded(under + 1)) > CAP
        assert_over_cap(await h.client.post("/sessions", json=seeded(under + 1)))
        # Not decoded: a body over the cap with a wrong field is refused for its size, not
        # for the field (a decoder would have had to read it all to find it).
        broken = {**seeded(under + 1), "agent": {"name": 7}}
        assert_over_cap(await h.client.post("/sessions", json=broken))

        session_id = await h.new_session()
        at_cap = next(n for n in range(400, 0, -1) if values(turn(n, "none")) <= CAP)
        for stream in ("none", "delta", "message"):  # `none` the lean route answers
            over = await h.client.post(
                f"/sessions/{session_id}/turns", json=turn(at_cap + 1, stream)
            )
            assert_over_cap(over)
        answered = await h.client.post(f"/sessions/{session_id}/turns", json=turn(at_cap, "none"))
        assert answered.status_code == 200, answered.text
        history = await h.client.get(f"/sessions/{session_id}/history?type=full")
        assert history.status_code == 200
        assert len(history.json()["history"]["full"]) == 2  # only the turn within the cap ran


async def test_during_a_drain_every_route_that_takes_work_answers_503_before_its_cap(
    tmp_path: Path,
) -> None:
    """The drain and the cap are one app-level hook: a route with a hook of its own would
    replace it (Litestar) and take work during a drain. Every route the app serves is asked,
    so a route added later is asked too; a body over the cap is refused for the drain."""
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, max_json_values_per_request=CAP)
    async with app_harness(tmp_path, settings=settings) as h:
        session_id = await h.new_session()
        h.app.state.drain.draining = True
        over_cap = msgspec.json.encode(turn(CAP, "none"))
        asked = set()
        for route in h.app.routes:
            path = re.sub(r"\{(\w+):\w+\}", session_id, route.path)
            for method in set(getattr(route, "methods", ())) - {"GET", "HEAD", "OPTIONS"}:
                response = await h.client.request(
                    method, path, content=over_cap, headers={"Content-Type": "application/json"}
                )
                assert_error(response, 503, "shutting_down")
                assert response.headers["Retry-After"] == "5"
                asked.add(f"{method} {route.path}")
        assert {"POST /sessions", "POST /sessions/{session_id:str}/turns", "POST /aos"} <= asked
        # Reads are still served, and the session was not touched.
        history = await h.client.get(f"/sessions/{session_id}/history?type=full")
        assert history.status_code == 200
        assert history.json()["history"]["full"] == []
