"""Cost of the knowledge base: indexing a folder and one search, at two corpus sizes.

    python bench/knowledge.py

Builds a folder of Markdown files of ~1 MB and ~10 MB of varied words, times the index build
(once each) and `KnowledgeBase.search` of a three-word query (median and p99 over many rounds,
no rescan), and prints the ratio of the larger corpus to the smaller one, all in the same run.
BM25 over FTS5 reads only the posting lists of the query's terms, so a search should grow far
less than the corpus.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aap_server.toolkits.knowledge import KnowledgeBase

ROUNDS = 500
VOCABULARY = [f"term{n}" for n in range(20_000)] + ["kettle", "descaling", "vinegar"]


def corpus(folder: Path, megabytes: int, rng: random.Random) -> None:
    per_file = 50_000
    for number in range(megabytes * 1_000_000 // per_file):
        words: list[str] = []
        size = 0
        while size < per_file:
            word = rng.choice(VOCABULARY)
            words.append(word)
            size += len(word) + 1
        (folder / f"doc{number}.md").write_text(" ".join(words), encoding="utf-8")


def measure(megabytes: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        corpus(folder, megabytes, random.Random(megabytes))
        started = time.perf_counter()
        knowledge = KnowledgeBase([folder], rescan_seconds=3600)
        build = time.perf_counter() - started
        times = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            knowledge.search("how to descale", ["kettle", "vinegar"])
            times.append(time.perf_counter() - started)
        times.sort()
        return build, statistics.median(times), times[int(len(times) * 0.99)]


def main() -> None:
    small = measure(1)
    large = measure(10)
    for label, (build, median, p99) in (("1 MB", small), ("10 MB", large)):
        print(
            f"{label:>6}: index {build * 1000:8.1f} ms   search median {median * 1e6:8.1f} µs"
            f"   p99 {p99 * 1e6:8.1f} µs"
        )
    index_ratio, search_ratio = large[0] / small[0], large[1] / small[1]
    print(f"10 MB / 1 MB: index x{index_ratio:.1f}, search median x{search_ratio:.1f}")


if __name__ == "__main__":
    main()
