"""The hot path's lock-free counters and histograms scrape exactly as `prometheus_client`'s own
would for the same updates (bucket bounds included: a value equal to a bound is in it)."""

from __future__ import annotations

import random
import sys
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aap_server.telemetry.metrics import HotCounter, HotHistogram, Metrics, _HotSeries

BUCKETS = (0.0001, 0.00025, 0.001, 0.5, 1, 2.5)


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    found = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                found[sample.name, frozenset(sample.labels.items())] = sample.value
    return found


def test_hot_series_scrape_like_prometheus_client() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counter = Counter("c", "counted", ["a", "b"], registry=theirs)
    histogram = Histogram("h", "timed", ["a"], buckets=BUCKETS, registry=theirs)
    hot_counter = HotCounter("c", "counted", ["a", "b"])
    hot_histogram = HotHistogram("h", "timed", ["a"], BUCKETS)
    ours.register(_HotSeries(hot_counter, hot_histogram))
    rng = random.Random(7)
    values = [*BUCKETS, 0.0, 3.0, 1e-9, *(rng.uniform(0, 3) for _ in range(2000))]
    for value in values:
        a, b = rng.choice("xyz"), rng.choice(["", "rule-1"])
        counter.labels(a, b).inc()
        hot_counter.inc((a, b))
        histogram.labels(a).observe(value)
        hot_histogram.observe((a,), value)
    expected, got = samples(theirs), samples(ours)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_steps_are_counted_from_their_check_durations_with_no_update_of_their_own() -> None:
    """`aap_steps` scrapes as a counter updated per check would, and a check updates two
    series (its duration, its verdict), not three."""
    metrics = Metrics("1.0.0")
    theirs = CollectorRegistry()
    counter = Counter("aap_steps", "counted", ["method"], registry=theirs)
    calls = 0

    def count(frame: Any, event: str, _: object) -> None:
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.endswith("telemetry/metrics.py"):
            calls += 1

    rng = random.Random(3)
    for _ in range(500):
        method = rng.choice(["steps/message", "steps/toolCallRequest"])
        counter.labels(method).inc()
        sys.setprofile(count)
        try:
            metrics.step_checked(method, "allow", "", rng.uniform(0, 0.01))
        finally:
            sys.setprofile(None)
    expected = samples(theirs)
    got = {key: value for key, value in samples(metrics.registry).items() if key in expected}
    assert got == expected
    assert len(expected) == 2
    assert calls == 500 * 3  # step_checked, its duration's observe, its verdict's inc
