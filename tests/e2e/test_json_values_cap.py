"""`POST /aos` refuses a body of more JSON values than `max_json_values_per_request` before
parsing it (decoding is one C call on the event loop: a 10 MB `[{},{},…]` held every other
client for seconds), and answers one at the cap as before."""

from __future__ import annotations

from pathlib import Path

from aap_server.config import Settings
from tests.conftest import KEYS, harness


async def test_a_body_over_the_json_values_cap_is_not_parsed(tmp_path: Path) -> None:
    cap = 1000
    settings = Settings(db=str(tmp_path / "aap.db"), api_keys=KEYS, max_json_values_per_request=cap)
    async with harness(tmp_path, settings=settings) as h:

        async def post(entries: int) -> object:
            # `[1,1,…]`: the array and each item are values (the `[` and the `,`s count them).
            body = b"[" + b",".join([b"1"] * entries) + b"]"
            response = await h.client.post(
                "/aos", content=body, headers={"Content-Type": "application/json"}
            )
            assert response.status_code == 200, response.text
            return response.json()

        at_cap = await post(cap - 1)  # cap values: decoded, each entry answered
        assert isinstance(at_cap, list)
        assert len(at_cap) == cap - 1
        assert at_cap[0]["error"]["code"] == -32600
        assert "not an object" in at_cap[0]["error"]["message"]

        over = await post(cap)
        assert isinstance(over, dict)
        assert over["id"] is None
        assert over["error"]["code"] == -32700  # not parsed
        message = over["error"]["message"]
        assert message.startswith("Invalid JSON payload: not parsed")
        assert f"more than {cap} JSON values" in message
        assert "max_json_values_per_request" in message


async def test_the_cap_defaults_high_enough_for_a_batch_of_typical_steps(tmp_path: Path) -> None:
    assert Settings().max_json_values_per_request == 100_000
