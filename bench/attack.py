"""Does one attacker freeze everyone? Other clients' latency with and without a stream of
worst-case requests (issue 7, item 1).

Starts a real aap-server (default policy, SQLite in a temp dir) on loopback, then measures the
p50/p99 of `GET /meta` and of small `none` turns from a well-behaved client, first alone, then
while attackers keep sending the worst payloads we know (≈900 KB POST /aos tool results and
≈900 KB user messages made of repeated `-----BEGIN PRIVATE KEY-----` lines, `aa.` host runs
and `x://a:b@c.de/` URL runs; and requests made of many small costly steps, each once under the
32 KB worker threshold: a `POST /aos` batch of 120 steps of 30 KB and a `POST /sessions` of 600 seed
messages of 9 KB of `a@`; a turn carrying a ≈900 KB `data:` URI image, and a ≈900 KB
`POST /aos` body of `[{},{},…]`, both costly to validate or decode), and prints both and their
ratio. Bounded: a fixed number of measured requests per phase, every request with a timeout.
With `--against REF`, the same run measures aap-server as of git REF too (before/after).

    python bench/attack.py [--samples 200] [--attackers 2] [--against REF]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
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
from bench._common import launch_server, wait_ready
from bench.throughput import checkout

ROOT = Path(__file__).resolve().parent.parent
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


def costly_to_read_payloads() -> tuple[bytes, bytes]:
    """A turn with a ≈900 KB data: URI image, and a ≈900 KB POST /aos body of empty objects."""
    image = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 2600).decode()
    turn = {"messages": [{"role": "user", "content": [{"type": "image", "url": image}]}]}
    return msgspec.json.encode(turn), b"[" + b",".join([b"{}"] * (PAYLOAD_CHARS // 3)) + b"]"


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


async def attacker(base: str, stop: asyncio.Event, sent: list[float], first: int) -> None:
    """Worst-case requests back to back, from kind `first` of the six on (attackers start
    apart, so a short phase still sees every kind)."""
    aos_bodies, turn_bodies = aos_payloads(), turn_payloads()
    batch_body, seed_body = many_small_payloads()
    image_turn, empty_objects = costly_to_read_payloads()
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        session = (await client.post("/sessions", json={"agent": {"name": "demo"}})).json()
        url = f"/sessions/{session['sessionId']}/turns"
        number = first
        while not stop.is_set():
            started = time.perf_counter()
            kind = number % 6
            if kind == 0:
                await client.post("/aos", content=aos_bodies[number // 6 % 3], headers=JSON)
            elif kind == 1:
                await client.post(url, content=turn_bodies[number // 6 % 3], headers=JSON)
            elif kind == 2:
                await client.post("/aos", content=batch_body, headers=JSON)
            elif kind == 3:
                await client.post("/sessions", content=seed_body, headers=JSON)
            elif kind == 4:
                await client.post(url, content=image_turn, headers=JSON)
            else:
                await client.post("/aos", content=empty_objects, headers=JSON)
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


async def phases(
    base: str, samples: int, attackers: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], list[float]]:
    """Other clients' latencies alone, then under attack; the attack requests' times."""
    await measure(base, 20)  # warm up
    quiet = await measure(base, samples)
    stop = asyncio.Event()
    attack_times: list[float] = []
    tasks = [
        asyncio.create_task(attacker(base, stop, attack_times, index * 6 // attackers))
        for index in range(attackers)
    ]
    await asyncio.sleep(1.0)  # let the attack get going
    loud = await measure(base, samples)
    stop.set()
    await asyncio.gather(*tasks)
    return quiet, loud, attack_times


async def main(samples: int, attackers: int, against: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sources: list[tuple[str, str | None]] = [("this tree", None)]
        if against:
            sources.insert(0, (f"@{against}", str(checkout(against, Path(tmp)))))
        results = []
        for number, (name, source) in enumerate(sources):
            env = {"AAP_DB": str(Path(tmp) / f"attack{number}.db"), "AAP_LOG_LEVEL": "warning"}
            process, base = launch_server(env, cwd=source)
            try:
                wait_ready(process, base)
                results.append((name, *await phases(base, samples, attackers)))
            finally:
                process.terminate()
                process.wait(timeout=30)
    print(f"{samples} requests of each kind per phase; {attackers} attackers sending ~900 KB")
    print("pathological POST /aos and turn bodies back to back")
    heads = ("p50 alone", "p99 alone", "p50 attack", "p99 attack", "p99 ratio")
    print(f"{'server':<12} {'request':<20} " + " ".join(f"{head:>11}" for head in heads))
    for name, quiet, loud, attack_times in results:
        for request in quiet:
            a50, a99 = p(quiet[request], 50), p(quiet[request], 99)
            b50, b99 = p(loud[request], 50), p(loud[request], 99)
            print(
                f"{name:<12} {request:<20} {a50:9.1f}ms {a99:9.1f}ms {b50:9.1f}ms {b99:9.1f}ms "
                f"{b99 / a99:10.1f}x"
            )
        if len(attack_times) >= 2:
            print(
                f"{name:<12} attack requests: {len(attack_times)}, "
                f"median {statistics.median(attack_times):.2f} s"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("--against", help="also measure aap-server as of this git ref, first")
    args = parser.parse_args()
    asyncio.run(main(args.samples, args.attackers, args.against))
