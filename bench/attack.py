"""Does one attacker freeze everyone? Other clients' latency with and without a stream of
worst-case requests (issue 7, item 1).

Starts a real aap-server (default policy, SQLite in a temp dir) on loopback, then measures the
p50/p99 of `GET /meta` and of small `none` turns from a well-behaved client, first alone, then
while attackers keep sending the worst payloads we know (≈900 KB POST /aos tool results and
≈900 KB user messages made of repeated `-----BEGIN PRIVATE KEY-----` lines, `aa.` host runs
and `x://a:b@c.de/` URL runs; and requests made of many small costly steps, each once under the
32 KB worker threshold: a `POST /aos` batch of 120 steps of 30 KB and a `POST /sessions` of 600 seed
messages of 9 KB of `a@`), and prints both and their ratio. Bounded: a fixed number of
measured requests per phase, every request with a timeout.

    python bench/attack.py [--samples 200] [--attackers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from agents.demo import AGENT as DEMO
from bench._common import start_server

JSON = {"Content-Type": "application/json"}
UNITS = ("-----BEGIN PRIVATE KEY-----\n", "aa.", "x://a:b@c.de/")
PAYLOAD_CHARS = 900_000
HI = {"messages": [{"role": "user", "content": "hi"}]}


def aos_payloads() -> list[bytes]:
    steps = StepFactory(
        agent=aos_agent(DEMO, []),
        session_id="sess_attack",
        turn_id="turn_attack",
        principal=Principal(user_id="mallory", org_id="evil"),
    )
    return [
        msgspec.json.encode(
            steps.tool_call_result("c1", unit * (PAYLOAD_CHARS // len(unit)), False)
        )
        for unit in UNITS
    ]


def turn_payloads() -> list[bytes]:
    return [
        msgspec.json.encode(
            {"messages": [{"role": "user", "content": unit * (PAYLOAD_CHARS // len(unit))}]}
        )
        for unit in UNITS
    ]


def many_small_payloads() -> tuple[bytes, bytes]:
    """A POST /aos batch and a POST /sessions body of many small, costly steps."""
    steps = StepFactory(
        agent=aos_agent(DEMO, []),
        session_id="sess_attack",
        turn_id="turn_attack",
        principal=Principal(user_id="mallory", org_id="evil"),
    )
    batch = [steps.tool_call_result(f"c{n}", "a@" * 15_000, False) for n in range(120)]
    seed = [
        {"role": "user", "content": "a@" * 4500}
        if n % 2 == 0
        else {"role": "assistant", "content": "ok"}
        for n in range(600)
    ]
    return msgspec.json.encode(batch), msgspec.json.encode(
        {"agent": {"name": "demo"}, "messages": seed}
    )


async def attacker(base: str, stop: asyncio.Event, sent: list[float]) -> None:
    aos_bodies, turn_bodies = aos_payloads(), turn_payloads()
    batch_body, seed_body = many_small_payloads()
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        session = (await client.post("/sessions", json={"agent": {"name": "demo"}})).json()
        url = f"/sessions/{session['sessionId']}/turns"
        number = 0
        while not stop.is_set():
            started = time.perf_counter()
            if number % 4 == 2:
                await client.post("/aos", content=batch_body, headers=JSON)
            elif number % 4 == 3:
                await client.post("/sessions", content=seed_body, headers=JSON)
            elif number % 2 == 0:
                body = aos_bodies[number // 2 % len(aos_bodies)]
                await client.post(
                    "/aos", content=body, headers={"Content-Type": "application/json"}
                )
            else:
                body = turn_bodies[number // 2 % len(turn_bodies)]
                await client.post(url, content=body, headers=JSON)
            sent.append(time.perf_counter() - started)
            number += 1


async def measure(base: str, samples: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"GET /meta": [], "small turn (none)": []}
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        session = (await client.post("/sessions", json={"agent": {"name": "demo"}})).json()
        url = f"/sessions/{session['sessionId']}/turns"
        for _ in range(samples):
            started = time.perf_counter()
            response = await client.get("/meta")
            times["GET /meta"].append(time.perf_counter() - started)
            assert response.status_code == 200
            started = time.perf_counter()
            response = await client.post(
                url, json={"messages": [{"role": "user", "content": "hi"}]}
            )
            times["small turn (none)"].append(time.perf_counter() - started)
            assert response.status_code == 200, response.text
    return times


def p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000


async def main(samples: int, attackers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "attack.db")
        process, base = start_server({"AAP_DB": db, "AAP_LOG_LEVEL": "warning"})
        try:
            await measure(base, 20)  # warm up
            quiet = await measure(base, samples)
            stop = asyncio.Event()
            attack_times: list[float] = []
            tasks = [
                asyncio.create_task(attacker(base, stop, attack_times)) for _ in range(attackers)
            ]
            await asyncio.sleep(1.0)  # let the attack get going
            loud = await measure(base, samples)
            stop.set()
            await asyncio.gather(*tasks)
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(f"{samples} requests of each kind per phase; {attackers} attackers sending ~900 KB")
    print("pathological POST /aos and turn bodies back to back")
    heads = ("p50 alone", "p99 alone", "p50 attack", "p99 attack", "p99 ratio")
    print(f"{'request':<20} " + " ".join(f"{head:>11}" for head in heads))
    for name in quiet:
        a50, a99 = p(quiet[name], 50), p(quiet[name], 99)
        b50, b99 = p(loud[name], 50), p(loud[name], 99)
        print(f"{name:<20} {a50:9.1f}ms {a99:9.1f}ms {b50:9.1f}ms {b99:9.1f}ms {b99 / a99:10.1f}x")
    if len(attack_times) >= 2:
        print(
            f"attack requests: {len(attack_times)}, median {statistics.median(attack_times):.2f} s"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--attackers", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.samples, args.attackers))
