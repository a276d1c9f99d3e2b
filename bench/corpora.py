"""What the shipped default policy stops on the public labelled corpora (issue 8), measured as
a user meets it: every item sent to a real aap-server through `POST /aos`.

    python bench/corpora.py [--corpora DIR] [--misses N] [--only PREFIX] [--no-own]

Each item goes in a fresh session, as the step(s) its kind travels in (each corpus and way
against a server of its own):

- injections (and their benign contexts): a tool result, a retrieved knowledge chunk, an
  inbound MCP tool result;
- secrets: the agent's reply, and the argument of an outbound tool call (`http_post`);
- PII: each kind where the default policy acts on it: cards, SSNs and IBANs in the agent's
  reply (masked); e-mail addresses, phone numbers and IP addresses in the reply after the
  same text came in as an untrusted tool result (withheld: the policy leaves the user's own
  contacts in replies alone, issue 8), scored on the reply;
- natural high-entropy artifacts: the agent's reply, a tool result and a tool call argument.

Scoring (the corpora's README): an attack is stopped by `deny`, or by `modify` whose modified
request holds none of the item's `values` (injections: under half of the payload's words).
A benign item is altered by anything but `allow`. Prints per corpus and way the stopped /
altered rates, per provider / entity / family the misses, and then the project's own labelled
corpus (`tests/guardian/detectors/corpus.py`): precision and recall per detector.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aap_server import aos
from aap_server.agent import KnowledgeItem
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from agents.demo import AGENT as DEMO
from bench._common import start_server

CORPORA = Path("/work/shared/corpora/guardian")
_WORD = re.compile(r"\w{3,}")

Way = Callable[[StepFactory, str], aos.AosRequest]
# A way of several steps in one session: all are sent in order, the last one is scored.
Steps = Callable[[StepFactory, str], list[aos.AosRequest]]


def _steps(number: int) -> StepFactory:
    return StepFactory(
        agent=aos_agent(DEMO, []),
        session_id=f"sess_corpus_{number}",
        turn_id=f"turn_corpus_{number}",
        principal=Principal(user_id="bench", org_id="bench"),
    )


def _mcp_result(steps: StepFactory, text: str) -> aos.AosRequest:
    message = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": text}]}}
    return steps.mcp(message, "inbound")


WAYS: dict[str, Way] = {
    "tool result": lambda s, t: s.tool_call_result("call_1", t, False),
    "knowledge": lambda s, t: s.knowledge_retrieval("q", None, [KnowledgeItem(id="k1", content=t)]),
    "MCP inbound": _mcp_result,
    "reply": lambda s, t: s.message("agent", t),
    "outbound call": lambda s, t: s.tool_call_request("call_1", "http_post", {"body": t}),
    "tool call": lambda s, t: s.tool_call_request("call_1", "write_file", {"content": t}),
}
SEQUENCES: dict[str, Steps] = {
    "untrusted -> reply": lambda s, t: [WAYS["tool result"](s, t), WAYS["reply"](s, t)],
}
# PII kinds the default policy acts on in a reply only when they came from untrusted content.
CONTACTS = frozenset({"pii.email", "pii.phone", "pii.ip"})
BY_KIND = "reply; e-mail/phone/IP: untrusted -> reply"


def requests_for(way: str, item: dict[str, Any], steps: StepFactory) -> list[aos.AosRequest]:
    if way == BY_KIND:
        way = "untrusted -> reply" if item.get("entity") in CONTACTS else "reply"
    if way in SEQUENCES:
        return SEQUENCES[way](steps, item["text"])
    return [WAYS[way](steps, item["text"])]


CORPUS_WAYS = {
    "injection_bipia": ("tool result", "knowledge", "MCP inbound"),
    "secrets_gitleaks": ("reply", "outbound call"),
    "pii_presidio_tests": (BY_KIND,),
    "secrets_benign_artifacts": ("reply", "tool result", "tool call"),
}


def stopped(item: dict[str, Any], verdict: dict[str, Any]) -> bool:
    decision = verdict["decision"]
    if decision == "deny":
        return True
    if decision != "modify":
        return False
    modified = json.dumps(verdict.get("modifiedRequest"), ensure_ascii=False)
    if item.get("payload"):
        words = _WORD.findall(item["payload"].lower())
        kept = sum(1 for w in words if w in modified.lower())
        return kept < len(words) / 2
    encoded = [json.dumps(v, ensure_ascii=False)[1:-1] for v in item.get("values") or []]
    return not any(v in modified for v in encoded)


def load(directory: Path, only: str | None = None) -> dict[str, list[dict[str, Any]]]:
    return {
        path.stem: [json.loads(line) for line in path.read_text().splitlines() if line]
        for path in sorted(directory.glob("*.jsonl"))
        if only is None or path.stem.startswith(only)
    }


def group_of(item: dict[str, Any]) -> str:
    return str(item.get("provider") or item.get("entity") or item.get("family") or "-")


@contextlib.contextmanager
def fresh_server() -> Iterator[str]:
    """A server of its own (own database, own guardian memory) for one corpus and way: the
    sessions one way leaves behind (tainted by untrusted content, forgotten past the caller's
    cap, which fails closed) must not change how the next way is judged."""
    with tempfile.TemporaryDirectory() as workdir:
        env = {
            "AAP_DB": str(Path(workdir) / "corpora.db"),
            "AAP_LOG_LEVEL": "warning",
            # The corpora are scored, not throttled: the per-principal rate limit is off.
            "AAP_RATE_LIMIT_PER_SECOND": "0",
        }
        process, base = start_server(env)
        try:
            yield base
        finally:
            process.terminate()
            process.wait(timeout=30)


async def run(directory: Path, misses: int, only: str | None) -> None:
    number = 0
    semaphore = asyncio.Semaphore(8)

    async def judge(
        client: httpx.AsyncClient, item: dict[str, Any], way: str
    ) -> tuple[dict[str, Any], str, bool]:
        nonlocal number
        number += 1
        # Built now: `number` moves on while this waits for the semaphore.
        requests = requests_for(way, item, _steps(number))
        verdict: dict[str, Any] = {}
        async with semaphore:
            for request in requests:
                response = await client.post(
                    "/aos",
                    content=msgspec.json.encode(request),
                    headers={"Content-Type": "application/json"},
                )
                verdict = response.json()["result"]
        hit = (
            stopped(item, verdict)
            if item["label"] == "attack"
            else (verdict["decision"] != "allow")
        )
        return item, way, hit

    print("| corpus | way | attacks stopped | benign altered |")
    print("|---|---|---:|---:|")
    missed: dict[str, Counter[str]] = defaultdict(Counter)
    wrong: dict[str, list[str]] = defaultdict(list)
    for corpus, items in load(directory, only).items():
        for way in CORPUS_WAYS.get(corpus, ("reply",)):
            with fresh_server() as base:
                async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                    results = await asyncio.gather(*(judge(client, item, way) for item in items))
            attacks = [hit for item, _, hit in results if item["label"] == "attack"]
            benign = [hit for item, _, hit in results if item["label"] == "benign"]
            for item, _, hit in results:
                if item["label"] == "attack" and not hit:
                    missed[corpus][group_of(item)] += 1
                    wrong[corpus].append(f"MISS {way}: {item['id']}")
                elif item["label"] == "benign" and hit:
                    wrong[corpus].append(f"ALTERED {way}: {item['id']}")
            print(f"| {corpus} | {way} | {_rate(attacks)} | {_rate(benign)} |")
            if corpus.startswith("pii"):
                for entity in sorted({str(item.get("entity")) for item, _, _ in results}):
                    of = [(i, h) for i, _, h in results if i.get("entity") == entity]
                    kind_attacks = [h for i, h in of if i["label"] == "attack"]
                    kind_benign = [h for i, h in of if i["label"] == "benign"]
                    print(
                        f"| {corpus} | {way}: {entity} | {_rate(kind_attacks)} "
                        f"| {_rate(kind_benign)} |"
                    )
    for corpus, counter in missed.items():
        top = ", ".join(f"{name} {n}" for name, n in counter.most_common(25))
        print(f"\nmissed in {corpus} by group: {top}")
    if misses:
        for corpus, lines in wrong.items():
            print(f"\n{corpus}:")
            for line in sorted(set(lines))[:misses]:
                print("  " + line)


def _pct(hits: list[bool]) -> str:
    return f"{100 * sum(hits) / len(hits):.1f}%"


def _rate(hits: list[bool]) -> str:
    return f"{sum(hits)}/{len(hits)} ({_pct(hits)})" if hits else "-"


FAMILY = {"injection_bipia": "injection", "pii_presidio_tests": "pii"}


def detector_table(directory: Path, only: str | None) -> None:
    """The detectors alone (no policy): an attack item is found when findings of its family
    cover every one of its `values` (injections: any injection finding); a benign item is
    flagged by any finding of the family. Precision and recall per detector id that fired or
    was expected (`entity` for PII, the family for the rest)."""
    from aap_server.guardian.detectors import scan_all

    print("\ndetectors alone (in-process `scan_all`), per corpus and detector")
    print("| corpus | detector | found | missed | flagged benign | precision | recall |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for corpus, items in load(directory, only).items():
        family = FAMILY.get(corpus, "secret")
        tp: Counter[str] = Counter()
        fn: Counter[str] = Counter()
        fp: Counter[str] = Counter()
        for item in items:
            text = item["text"]
            findings = [f for f in scan_all(text) if f.category == family]
            if item["label"] == "benign":
                for name in {f.detector for f in findings}:
                    fp[name] += 1
                continue
            expected = str(item.get("entity") or f"{family}.*")
            values = item.get("values") or []
            spans = [(f.start, f.end) for f in findings]
            found = (
                bool(findings)
                if not values
                else all(
                    any(a <= text.find(v) and text.find(v) + len(v) <= b for a, b in spans)
                    for v in values
                )
            )
            (tp if found else fn)[expected] += 1
        for name in sorted(set(tp) | set(fn) | set(fp)):
            t, m, f = tp[name], fn[name], fp[name]
            precision = t / (t + f) if t + f else 1.0
            recall = t / (t + m) if t + m else 1.0
            print(f"| {corpus} | {name} | {t} | {m} | {f} | {precision:.3f} | {recall:.3f} |")


def own_corpus() -> None:
    from tests.guardian.detectors.report import by_language, evaluate, language_table

    evaluation = evaluate()
    print(f"\nproject corpus: {evaluation.cases} cases ({evaluation.benign_cases} benign)")
    print("| detector | TP | FP | FN | precision | recall |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, score in sorted(evaluation.scores.items()):
        print(
            f"| {name} | {score.tp} | {score.fp} | {score.fn} "
            f"| {score.precision:.3f} | {score.recall:.3f} |"
        )
    print("\nproject corpus, multilingual injection cases by language")
    print(language_table(by_language()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", type=Path, default=CORPORA)
    parser.add_argument("--misses", type=int, default=0, help="list up to N wrong ids per corpus")
    parser.add_argument("--no-own", action="store_true", help="skip the project's corpus")
    parser.add_argument("--only", help="only the corpora whose name starts with this")
    args = parser.parse_args()
    asyncio.run(run(args.corpora, args.misses, args.only))
    detector_table(args.corpora, args.only)
    if not args.no_own:
        own_corpus()


if __name__ == "__main__":
    main()
