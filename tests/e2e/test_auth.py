"""Authentication and tenancy over real HTTP (AAP endpoints.md "Authentication"; DESIGN
"Decisions already taken": Bearer keys map to a principal; a principal sees only its own
sessions, others' are 404; no keys configured means an open server)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from aap_server.config import ApiKey, Settings
from tests.conftest import KEYS, Harness, assert_error, harness

HI = {"role": "user", "content": "hi"}
TURN = {"messages": [HI]}


def endpoints(session_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every authenticated endpoint, as (method, path, request kwargs)."""
    return [
        ("GET", "/sessions", {}),
        ("POST", "/sessions", {"json": {"agent": {"name": "demo"}}}),
        ("GET", f"/sessions/{session_id}", {}),
        ("DELETE", f"/sessions/{session_id}", {}),
        ("GET", f"/sessions/{session_id}/history", {"params": {"type": "full"}}),
        ("GET", f"/sessions/{session_id}/history", {"params": {"type": "compacted"}}),
        ("POST", f"/sessions/{session_id}/turns", {"json": TURN}),
    ]


async def stored_view(h: Harness, session_id: str) -> tuple[Any, ...]:
    session = await h.client.get(f"/sessions/{session_id}")
    full = await h.client.get(f"/sessions/{session_id}/history", params={"type": "full"})
    listing = await h.client.get("/sessions")
    return session.json(), full.json(), listing.json()


BAD_AUTHORIZATION = {
    "no header": None,
    "unknown key": "Bearer key-mallory",
    "key in another case": "Bearer KEY-ALICE",
    "scheme only": "Bearer",
    "basic scheme": "Basic a2V5LWFsaWNlOg==",
    "key without scheme": "key-alice",
    "key with a suffix": "Bearer key-alice2",
    "key prefix": "Bearer key-ali",
}


# AAP endpoints.md "Authentication" + DESIGN: without a valid key every endpoint but the
# public /meta is a 401 JSON error with `WWW-Authenticate: Bearer`, and nothing changes.
@pytest.mark.parametrize("authorization", BAD_AUTHORIZATION.values(), ids=BAD_AUTHORIZATION.keys())
async def test_every_endpoint_but_meta_is_401_without_a_valid_key(
    h: Harness, authorization: str | None
) -> None:
    session_id = await h.new_session()
    assert (await h.client.post(f"/sessions/{session_id}/turns", json=TURN)).status_code == 200
    before = await stored_view(h, session_id)
    async with httpx.AsyncClient(base_url=h.base_url, timeout=10) as anonymous:
        headers = {"Authorization": authorization} if authorization is not None else {}
        for method, path, kwargs in endpoints(session_id):
            response = await anonymous.request(method, path, headers=headers, **kwargs)
            assert_error(response, 401, "unauthorized")
            assert response.headers["www-authenticate"] == "Bearer"
        assert (await anonymous.get("/meta", headers=headers)).status_code == 200
    assert await stored_view(h, session_id) == before


# DESIGN "Decisions": authentication comes first; an unauthenticated caller learns nothing
# about its body (no 400) and the server reads none of it (no 413).
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/sessions", b"{not json"),
        ("/sessions", b"[]"),
        ("/sessions/sess_x/turns", b'{"messages": []}'),
        ("/sessions/sess_x/turns", b'{"messages": [' + b"[" * 5000),
    ],
)
async def test_unauthenticated_bad_body_is_401_not_400(h: Harness, path: str, body: bytes) -> None:
    async with httpx.AsyncClient(base_url=h.base_url, timeout=10) as anonymous:
        response = await anonymous.post(
            path, content=body, headers={"Content-Type": "application/json"}
        )
        assert_error(response, 401, "unauthorized")


async def test_unauthenticated_oversized_body_is_401_not_413(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, max_body_bytes=256)
    async with (
        harness(tmp_path, settings=settings, key=None) as h,
        httpx.AsyncClient(base_url=h.base_url, timeout=10) as anonymous,
    ):
        response = await anonymous.post("/sessions", content=b"x" * 10_000)
        assert_error(response, 401, "unauthorized")


# DESIGN "Decisions": a principal sees only its own sessions; others' are 404 on EVERY
# endpoint, indistinguishable from a session that does not exist, and left untouched.
async def test_another_users_session_is_404_on_every_endpoint(h: Harness) -> None:
    alices = await h.new_session(options={"style": "pirate"})
    assert (await h.client.post(f"/sessions/{alices}/turns", json=TURN)).status_code == 200
    before = await stored_view(h, alices)
    bob_headers = {"Authorization": "Bearer key-bob"}
    async with httpx.AsyncClient(base_url=h.base_url, headers=bob_headers, timeout=10) as bob:
        for method, path, kwargs in endpoints(alices):
            if path == "/sessions":
                continue
            response = await bob.request(method, path, **kwargs)
            error = assert_error(response, 404, "session_not_found")
            unknown = await bob.request(
                method, path.replace(alices, "sess_0NOSUCHSESSION"), **kwargs
            )
            assert assert_error(unknown, 404)["code"] == error["code"]
        # Bob's turn on alice's session with overrides must not apply them either.
        override = {"agent": {"options": {"style": "upper"}}, "messages": [HI]}
        assert_error(await bob.post(f"/sessions/{alices}/turns", json=override), 404)
        listing = (await bob.get("/sessions")).json()
        assert listing == {"sessions": []}
    assert await stored_view(h, alices) == before


# DESIGN "Decisions": tenancy is per principal (user), not per organisation: alice and bob
# share `acme` but not sessions; each lists only their own.
async def test_each_principal_lists_only_its_own_sessions(h: Harness) -> None:
    alices = {await h.new_session() for _ in range(3)}
    bob_headers = {"Authorization": "Bearer key-bob"}
    async with httpx.AsyncClient(base_url=h.base_url, headers=bob_headers, timeout=10) as bob:
        created = [await bob.post("/sessions", json={"agent": {"name": "demo"}}) for _ in range(2)]
        bobs = {response.json()["sessionId"] for response in created}
        bob_list = {s["sessionId"] for s in (await bob.get("/sessions")).json()["sessions"]}
        for session_id in bobs:
            assert (await bob.get(f"/sessions/{session_id}")).status_code == 200
            assert_error(await h.client.get(f"/sessions/{session_id}"), 404)
    alice_list = {s["sessionId"] for s in (await h.client.get("/sessions")).json()["sessions"]}
    assert alice_list == alices
    assert bob_list == bobs


# DESIGN "Decisions": a cursor is no key to anyone else's sessions.
async def test_a_cursor_from_one_user_never_reveals_another_users_sessions(
    tmp_path: Path,
) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, page_size=2)
    async with harness(tmp_path, settings=settings) as h:
        alices = {await h.new_session() for _ in range(5)}
        cursor = (await h.client.get("/sessions")).json()["next"]
        bob_headers = {"Authorization": "Bearer key-bob"}
        async with httpx.AsyncClient(base_url=h.base_url, headers=bob_headers, timeout=10) as bob:
            response = await bob.get("/sessions", params={"after": cursor})
            if response.status_code == 200:
                listed = {s["sessionId"] for s in response.json()["sessions"]}
                assert not listed & alices
            else:
                assert_error(response, 400)


# DESIGN "Decisions": with no keys configured the server runs open (one local principal).
async def test_with_no_keys_configured_the_server_is_open(tmp_path: Path) -> None:
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=[])
    async with harness(tmp_path, settings=settings, key=None) as h:
        session_id = await h.new_session()
        assert (await h.client.get(f"/sessions/{session_id}")).status_code == 200
        response = await h.client.post(f"/sessions/{session_id}/turns", json=TURN)
        assert response.status_code == 200
        # Whatever a client sends as Authorization, it is the same (local) principal.
        headers = {"Authorization": "Bearer anything"}
        listed = (await h.client.get("/sessions", headers=headers)).json()["sessions"]
        assert [s["sessionId"] for s in listed] == [session_id]


# A key maps to exactly one principal; two keys for one user see the same sessions.
async def test_two_keys_of_one_user_share_that_users_sessions(tmp_path: Path) -> None:
    keys = [*KEYS, ApiKey(key="key-alice-laptop", user_id="alice", org_id="acme")]
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=keys)
    async with harness(tmp_path, settings=settings) as h:
        session_id = await h.new_session()
        laptop = {"Authorization": "Bearer key-alice-laptop"}
        assert (await h.client.get(f"/sessions/{session_id}", headers=laptop)).status_code == 200


# Principals are (organisation, user): the same user id in another organisation is someone
# else. The auth scheme name is case-insensitive (RFC 9110 §11.1).
async def test_same_user_id_in_another_org_is_another_principal(tmp_path: Path) -> None:
    keys = [*KEYS, ApiKey(key="key-alice-globex", user_id="alice", org_id="globex")]
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=keys)
    async with harness(tmp_path, settings=settings) as h:
        session_id = await h.new_session()
        globex = {"Authorization": "Bearer key-alice-globex"}
        assert_error(await h.client.get(f"/sessions/{session_id}", headers=globex), 404)
        lower = {"Authorization": "bearer key-alice"}
        assert (await h.client.get(f"/sessions/{session_id}", headers=lower)).status_code == 200


# Issue 12: the guards run on the route handler itself, not on a copy made per request.
async def test_authenticating_a_turn_copies_no_route_handler(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    import litestar.handlers.base

    from aap_server.api.routes import SessionsController

    session_id = await h.new_session()
    copied: list[object] = []
    # The module's own `from copy import copy` (not re-exported, so not an attribute to mypy).
    original: Callable[[object], object] = vars(litestar.handlers.base)["copy"]

    def counting(value: Any) -> Any:
        copied.append(value)
        return original(value)

    monkeypatch.setattr(litestar.handlers.base, "copy", counting)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    answer = await h.client.post(f"/sessions/{session_id}/turns", json=body)
    assert answer.status_code == 200
    assert copied == []
    # The guard still runs on that route: no key, no turn.
    refused = await h.client.post(
        f"/sessions/{session_id}/turns", json=body, headers={"Authorization": "Bearer nope"}
    )
    assert_error(refused, 401)
    assert SessionsController.guards
