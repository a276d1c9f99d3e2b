"""Per-step cost of the policy guardian with the shipped default policy.

For typical steps (a 96 B user message and agent reply, a 1 KB user message, a tool call
with arguments, a 4 KB tool result, a tool call after it) it prints the median and p99 CPU
time of one `check`, and the ratio to a bare `msgspec.json.decode` of the same request
measured in the same run, then what the detectors and the session memory's fingerprints
cost alone. Then it runs demo-agent turns in-process (SQLite on a temp file) and prints the
share of the turn's time spent in guardian checks. Last, it starts a second aap-server
process on loopback and prints what asking it as a remote guardian (after the in-process
policy) adds to each step.

    python bench/guardian.py          # all of the above
    python bench/guardian.py --steps  # only the per-step figures, detectors and fingerprints
    python bench/guardian.py --rss    # server RSS before/after 100 x 2 MB untrusted results
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aap_server import aos
from aap_server.guardian import Guardian
from aap_server.guardian.chain import ChainMember, GuardianChain
from aap_server.guardian.detectors import scan_all
from aap_server.guardian.memory import chunk_prints, decoded_forms, window_prints
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.guardian.remote import RemoteGuardian
from aap_server.protocol import (
    AgentConfig,
    PostSessionsRequest,
    PostSessionTurnRequest,
    UserMessage,
)
from aap_server.runtime import LOCAL_PRINCIPAL, AapService, AgentRegistry, none_view
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from aap_server.store.sqlite import SqliteSessionStore
from agents import discover
from agents.demo import AGENT as DEMO
from bench._common import start_server

WORDS = "the quick brown fox jumps over the lazy dog while the team reviews the quarterly plan"
NOTES = "agreed with the design group to move the launch review to next month and draft a memo"


def cpu_ns() -> int:
    """This thread's CPU time: what a step costs the guardian, whatever else the machine runs
    (on a shared machine wall-clock medians swing by half and p99s measure preemption). The
    steps, detectors and fingerprints below run synchronously on this thread."""
    return time.thread_time_ns()


def prose(size: int, reference: int | None = None, words: str = WORDS) -> str:
    text = "" if reference is None else f"ref {reference:06d}: "
    while len(text) < size:
        text += words + ". "
    return text[:size]


def requests(sample: int = 0) -> dict[str, aos.AosRequest]:
    """The steps as sample `sample` sends them: each sample is its own turn, and 200
    samples share a session, so the per-turn and per-session tool call limits of the default
    policy never trip (the benchmark measures allowed steps, not the deny path). Each sample's
    texts are its own (a reference number first), as real steps' are: none is answered from
    the guardian's cache of recent scans."""
    steps = StepFactory(
        agent=aos_agent(DEMO, []),
        session_id=f"sess_bench_{sample // 200}",
        turn_id=f"turn_bench_{sample}",
        principal=Principal(user_id="bench", org_id="bench"),
    )
    fresh = StepFactory(
        agent=aos_agent(DEMO, []),
        session_id=f"sess_bench_json_{sample // 10}",
        turn_id=f"turn_bench_{sample}",
        principal=Principal(user_id="bench", org_id="bench"),
    )
    return {
        # A chat turn's two checks (issue 12's `none` turn): what a check costs beyond its
        # text, the fixed part.
        "user message, 96 B": steps.message("user", prose(96, sample)),
        "agent reply, 96 B": steps.message("agent", prose(96, sample, NOTES)),
        "user message, 1 KB": steps.message("user", prose(1024, sample)),
        "tool call with arguments": steps.tool_call_request(
            "call_1",
            "send_email",
            {"to": "team@example.com", "subject": "Plan", "body": prose(300, sample)},
        ),
        "tool result, 4 KB": steps.tool_call_result("call_1", prose(4096, sample), False),
        # The typical tool result is JSON: numbers, ids and `"key": value` pairs.
        "tool result, 4 KB JSON": steps.tool_call_result("call_1", json_text(sample), False),
        # The same in sessions of 10 samples: their untrusted values (~150 a sample) all kept,
        # so each is fingerprinted and kept (in the 200 samples' session above the oldest are
        # forgotten from the 14th on, after which untrusted values are no longer looked up).
        "4 KB JSON, memory not full": fresh.tool_call_result("call_1", json_text(sample), False),
        # The session now remembers untrusted text: a tool call's arguments are looked up
        # in that memory (`window_prints`), the common case after any untrusted read.
        "tool call after the result": steps.tool_call_request(
            "call_2", "save_note", {"title": "Notes", "body": prose(1024, sample, NOTES)}
        ),
    }


def samples_of(count: int) -> dict[str, list[aos.AosRequest]]:
    built = [requests(sample) for sample in range(count)]
    return {name: [each[name] for each in built] for name in built[0]}


async def per_step(samples: int = 3000) -> None:
    guardian = PolicyGuardian(default_policy())
    print(f"per-step check, default policy, {samples} samples each")
    print(f"{'step':<26} {'median':>10} {'p99':>10} {'decode':>10} {'ratio':>7}")
    for name, each in samples_of(samples).items():
        decode_times, check_times = [], []
        for request in each:
            encoded = msgspec.json.encode(request)
            start = cpu_ns()
            msgspec.json.decode(encoded, type=aos.AosRequest)
            decode_times.append(cpu_ns() - start)
            start = cpu_ns()
            verdict = await guardian.check(request)
            check_times.append(cpu_ns() - start)
            assert verdict.decision == "allow", verdict
        median = statistics.median(check_times) / 1000
        decode = statistics.median(decode_times) / 1000
        p99 = statistics.quantiles(check_times, n=100)[98] / 1000
        print(f"{name:<26} {median:8.1f}µs {p99:8.1f}µs {decode:8.1f}µs {median / decode:6.1f}x")


def json_text(reference: int | None = None) -> str:
    """A 4 KB JSON tool result full of numbers and ids (sample `reference`'s ids are its own)."""
    first = 0 if reference is None else reference * 60
    rows = [
        {"id": f"ord_{n:06d}", "total": n * 13.7, "at": f"2024-05-{n % 28 + 1:02d}T10:30:00Z"}
        for n in range(first, first + 60)
    ]
    return msgspec.json.encode(rows).decode()[:4096]


def detector_texts(sample: int = 0) -> dict[str, str]:
    """4 KB texts as steps carry them: prose, a JSON tool result full of numbers and ids, and
    text whose normalised view differs (no-break spaces, accents, a Cyrillic word). Each
    sample's texts are its own (a reference number first, its own ids), as in `requests`: the
    detectors cache per-candidate verdicts, so one text scanned again and again measures
    those caches, not the scan of a new text."""
    unicode_unit = "Caf\u00e9 \u00e0 10\u00a0h, r\u00e9union \u2014 \u043f\u043b\u0430\u043d Q3. "
    unicode_text = f"ref {sample:06d}: " + unicode_unit * (4096 // len(unicode_unit) + 1)
    return {
        "prose, 4 KB": prose(4096, sample),
        "JSON tool result, 4 KB": json_text(sample),
        "non-ASCII prose, 4 KB": unicode_text[:4096],
    }


def detectors(samples: int = 2000) -> None:
    """`scan_all` alone (PII, secrets, injection) on each text, a distinct one per sample: the
    detectors' share of a step, and what the normalised view costs where it differs from the
    text."""
    print(f"\ndetectors alone (scan_all), {samples} distinct texts each")
    print(f"{'text':<26} {'median':>10} {'p99':>10}")
    texts = [detector_texts(sample) for sample in range(samples)]
    for name in texts[0]:
        times = []
        for each in texts:
            text = each[name]
            start = cpu_ns()
            scan_all(text)
            times.append(cpu_ns() - start)
        median = statistics.median(times) / 1000
        p99 = statistics.quantiles(times, n=100)[98] / 1000
        print(f"{name:<26} {median:8.1f}µs {p99:8.1f}µs")


def memory_prints(samples: int = 2000) -> None:
    """What the session memory's fingerprints cost alone: those kept of a 4 KB untrusted text
    (`chunk_prints`), and those a tool argument is looked up by (`window_prints`), against a
    bare lower-casing of the same text (a pass over it at C speed) measured in the same run."""
    print(f"\nmemory fingerprints alone, {samples} samples each")
    print(f"{'work':<26} {'median':>10} {'p99':>10} {'lower()':>10} {'ratio':>7}")
    argument = prose(1024)
    work = {
        "chunk_prints, 4 KB": (prose(4096), chunk_prints),
        "window_prints, 1 KB arg": (argument, lambda t: window_prints(decoded_forms(t))),
    }
    for name, (text, run) in work.items():
        times, baseline = [], []
        for _ in range(samples):
            start = cpu_ns()
            text.lower()
            baseline.append(cpu_ns() - start)
            start = cpu_ns()
            run(text)
            times.append(cpu_ns() - start)
        median = statistics.median(times) / 1000
        lower = statistics.median(baseline) / 1000
        p99 = statistics.quantiles(times, n=100)[98] / 1000
        print(f"{name:<26} {median:8.1f}µs {p99:8.1f}µs {lower:8.1f}µs {median / lower:6.0f}x")


class Timed(Guardian):
    """Adds up the time spent in the wrapped guardian's checks."""

    def __init__(self, inner: PolicyGuardian) -> None:
        self.inner = inner
        self.spent_ns = 0

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        start = time.perf_counter_ns()
        try:
            return await self.inner.check(request)
        finally:
            self.spent_ns += time.perf_counter_ns() - start


async def share_of_turn(turns: int = 1500) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteSessionStore(str(Path(tmp) / "bench.db"))
        await store.open()
        guardian = Timed(PolicyGuardian(default_policy()))
        service = AapService(registry=AgentRegistry(discover()), store=store, guardian=guardian)
        created = await service.create_session(
            LOCAL_PRINCIPAL, PostSessionsRequest(agent=AgentConfig(name="demo"))
        )
        request = PostSessionTurnRequest(messages=[UserMessage(content=prose(1024))])
        start = time.perf_counter_ns()
        for _ in range(turns):
            turn = await service.start_turn(LOCAL_PRINCIPAL, created.session_id, request)
            await none_view(turn.events())
        elapsed = time.perf_counter_ns() - start
        await store.close()
    print(
        f"\n{turns} demo turns (1 KB user message, `none`): "
        f"{elapsed / turns / 1000:.0f} µs per turn, guardian {guardian.spent_ns / turns / 1000:.0f}"
        f" µs per turn = {100 * guardian.spent_ns / elapsed:.1f}% of the turn"
    )


def start_remote(
    workdir: str, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    env = {
        "AAP_DB": str(Path(workdir) / "remote.db"),
        "AAP_LOG_LEVEL": "warning",
        # Every check comes from one (open) principal: per-key limits off.
        "AAP_RATE_LIMIT_PER_SECOND": "0",
        "AAP_MAX_STORED_BYTES": "0",
        **(extra_env or {}),
    }
    process, base = start_server(env, path="/health")
    return process, f"{base}/aos"


async def with_remote(samples: int = 1000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        process, url = start_remote(tmp)
        try:
            local = PolicyGuardian(default_policy())
            remote = RemoteGuardian(url, name="remote", timeout_seconds=2.0)
            chain = GuardianChain(
                [ChainMember(local, "in-process", 2.0), ChainMember(remote, "remote", 2.0)]
            )
            print(f"\nremote guardian (aap-server /aos on loopback), {samples} samples each")
            print(f"{'step':<26} {'in-process':>11} {'+ remote':>10} {'p99':>10}")
            for name, each in samples_of(samples).items():
                for request in each[:50]:  # warm the connection pool and the remote
                    await chain.check(request)
                local_times, chain_times = [], []
                for request in each:
                    start = time.perf_counter_ns()
                    await local.check(request)
                    local_times.append(time.perf_counter_ns() - start)
                    start = time.perf_counter_ns()
                    verdict = await chain.check(request)
                    chain_times.append(time.perf_counter_ns() - start)
                    assert verdict.decision == "allow", verdict
                local_median = statistics.median(local_times) / 1000
                median = statistics.median(chain_times) / 1000
                p99 = statistics.quantiles(chain_times, n=100)[98] / 1000
                print(f"{name:<26} {local_median:9.1f}µs {median:8.0f}µs {p99:8.0f}µs")
            await chain.close()
        finally:
            process.terminate()
            process.wait(timeout=30)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def memory_under_untrusted_results(calls: int = 100, size: int = 2 * 1024 * 1024) -> None:
    """The server's RSS before and after `calls` POST /aos tool results of `size` bytes, each
    with its own (long) lines: with the default scan limit (such results are refused unscanned) and
    with the limit raised to 4 MiB (they are scanned and their lines fingerprinted)."""
    print(f"\nserver RSS, {calls} x {size // (1024 * 1024)} MB untrusted tool results via /aos")
    for label, policy in (
        ("default policy (1 MiB scan limit)", ""),
        ("scan limit raised to 4 MiB", "version = 1\n[limits]\nmax_scan_bytes = 4194304\n"),
    ):
        with tempfile.TemporaryDirectory() as tmp:
            env = {}
            if policy:
                path = Path(tmp) / "policy.toml"
                path.write_text(policy)
                env["AAP_POLICY"] = str(path)
            process, url = start_remote(tmp, env)
            try:
                async with httpx.AsyncClient(timeout=120) as client:
                    steps = StepFactory(
                        agent=aos_agent(DEMO, []),
                        session_id="sess_rss",
                        turn_id="turn_rss",
                        principal=Principal(user_id="bench", org_id="bench"),
                    )
                    ping = steps.message("user", "hello")
                    await client.post(url, content=msgspec.json.encode(ping))
                    before = rss_mb(process.pid)
                    decisions: dict[str, int] = {}
                    for call in range(calls):
                        # Long lines (256 KB each, as in minified pages or CSV exports):
                        # what an implementation that keeps lines whole pays most for.
                        words = f"call {call:04d} part {{:02d}} of an untrusted page with words "
                        line_bytes = 256 * 1024
                        body = "\n".join(
                            (words.format(part) * (line_bytes // len(words)))
                            for part in range(size // line_bytes)
                        )
                        result = steps.tool_call_result(f"c{call}", body, False)
                        response = await client.post(url, content=msgspec.json.encode(result))
                        decision = response.json()["result"]["decision"]
                        decisions[decision] = decisions.get(decision, 0) + 1
                    after = rss_mb(process.pid)
                print(f"{label:<36} {before:7.0f} MB -> {after:7.0f} MB  verdicts {decisions}")
            finally:
                process.terminate()
                process.wait(timeout=30)


if __name__ == "__main__":
    if sys.argv[1:] == ["--rss"]:
        asyncio.run(memory_under_untrusted_results())
        sys.exit(0)
    asyncio.run(per_step())
    detectors()
    memory_prints()
    if sys.argv[1:] == ["--steps"]:
        sys.exit(0)
    asyncio.run(share_of_turn())
    asyncio.run(with_remote())
