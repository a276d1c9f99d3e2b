"""`aap-server serve --workers 2`: MCP steps a caller sends to `POST /aos` on both workers at
once (all in the caller's one unnamed session) are judged on their content, never denied
because the other worker changed the session's memory meanwhile (issue 8)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from aap_server.runtime.steps import StepFactory
from tests.e2e.lease_lapse import ALICE
from tests.e2e.server_process import ServerProcess, server_process
from tests.e2e.test_workers import connected_to, worker_pids

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux /proc")

CLIENTS_PER_WORKER = 4  # requests in flight on each worker
STEPS_PER_CLIENT = 100


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    # The steps are counted, not throttled: the per-principal rate limit is off.
    async with server_process(tmp_path, AAP_WORKERS="2", AAP_RATE_LIMIT_PER_SECOND="0") as server:
        deadline = time.monotonic() + 30
        while len(worker_pids(server)) < 2:
            assert time.monotonic() < deadline, "the second worker never started"
            await asyncio.sleep(0.05)
        yield server


def mcp_result(text: str) -> bytes:
    message = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": text}]}}
    return msgspec.json.encode(StepFactory.mcp(message, "inbound"))


async def test_mcp_steps_sent_to_both_workers_at_once_are_never_denied_for_memory(
    workers: ServerProcess,
) -> None:
    async def send(worker: int, client_number: int) -> list[str]:
        denied = []
        async with connected_to(workers, worker) as client:
            for number in range(STEPS_PER_CLIENT):
                text = f"{worker}-{client_number}-{number} the weather service answered: sunny"
                reply = await client.post(
                    "/aos",
                    content=mcp_result(text),
                    headers={**ALICE, "Content-Type": "application/json"},
                )
                assert reply.status_code == 200, reply.text
                result = reply.json()["result"]
                if result["decision"] != "allow":
                    denied.append(f"{result['decision']}: {result.get('reasonCode')}")
        return denied

    answers = await asyncio.gather(
        *(
            send(worker, client_number)
            for worker in sorted(worker_pids(workers))
            for client_number in range(CLIENTS_PER_WORKER)
        )
    )
    denied = [reason for answer in answers for reason in answer]
    total = 2 * CLIENTS_PER_WORKER * STEPS_PER_CLIENT
    assert denied == [], f"{len(denied)} of {total} benign MCP steps not allowed"
