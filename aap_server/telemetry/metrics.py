"""Prometheus metrics: one registry per app, so two apps in one process (tests) never share
counts. Every label's values come from a bounded set: route templates (not raw paths), hosted
agents, stop reasons, AOS methods, decisions, the policy's rule ids."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = CONTENT_TYPE_LATEST
# No `*_created` series beside every counter and histogram: they double a scrape's size, and
# Prometheus derives resets from the values.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Guardian checks take microseconds to a few milliseconds in process, a remote guardian up to
# its timeout (1 s by default).
_GUARDIAN_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1, 2.5)
# A turn streams a model's whole answer: seconds to minutes.
_TURN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class HotCounter:
    """A counter by label values that every request, turn or guardian check updates: a plain
    number per label values, no lock per increment (`prometheus_client` takes one; only the
    event loop's thread updates these), turned into a metric family when scraped."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, value in list(self.values.items()):
            family.add_metric(list(labels), value)
        return family


class HotHistogram:
    """A histogram by label values, kept like `HotCounter`: per label values, the count of
    each bucket (the last one `+Inf`) and the sum, one list."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.bounds = tuple(float(bound) for bound in buckets)
        self.series: dict[tuple[str, ...], list[float]] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        counts = self.series.get(labels)
        if counts is None:
            counts = self.series[labels] = [0.0] * (len(self.bounds) + 2)
        counts[bisect_left(self.bounds, value)] += 1  # the first bucket with value <= bound
        counts[-1] += value

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, counts in list(self.series.items()):
            counts = list(counts)
            buckets: list[tuple[str, float]] = []
            seen = 0.0
            for bound, count in zip((*self.bounds, float("inf")), counts, strict=False):
                seen += count
                buckets.append((floatToGoString(bound), seen))  # type: ignore[no-untyped-call]
            family.add_metric(list(labels), buckets, sum_value=counts[-1])
        return family


class CountOf(HotCounter):
    """A counter that counts what a `HotHistogram` with the same labels observes: its values
    are that histogram's counts, read when scraped (nothing to update per observation)."""

    def __init__(self, name: str, documentation: str, histogram: HotHistogram) -> None:
        super().__init__(name, documentation, histogram.labels)
        self.histogram = histogram

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        raise TypeError(f"{self.name} counts {self.histogram.name}'s observations")

    def family(self) -> Metric:
        self.values = {
            labels: sum(counts[:-1]) for labels, counts in list(self.histogram.series.items())
        }
        return super().family()


class _HotSeries(Collector):
    def __init__(self, *series: HotCounter | HotHistogram) -> None:
        self.series = series

    def collect(self) -> Iterator[Metric]:
        for one in self.series:
            yield one.family()


class Metrics:
    def __init__(self, version: str) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.request_seconds = HotHistogram(
            "aap_http_request_duration_seconds",
            "Time to answer an HTTP request (a stream: until it ends), by route and status",
            ["method", "route", "status"],
            Histogram.DEFAULT_BUCKETS[:-1],
        )
        # Every answered request has its duration observed: counted from those.
        self.requests = CountOf(
            "aap_http_requests",
            "HTTP requests answered, by method, route template and status",
            self.request_seconds,
        )
        self.turns = HotCounter(
            "aap_turns",
            "Turns ended, by agent and AAP stop reason",
            ["agent", "stop_reason"],
        )
        self.tokens = Counter(
            "aap_model_tokens",
            "Tokens the agents' models reported using, by agent and type (input, output)",
            ["agent", "type"],
            registry=registry,
        )
        self.turn_seconds = HotHistogram(
            "aap_turn_duration_seconds",
            "Time from a turn's start to its turn_stop, by agent",
            ["agent"],
            _TURN_BUCKETS,
        )
        self.verdicts = HotCounter(
            "aap_guardian_verdicts",
            "Guardian verdicts, by decision and policy rule id (empty: no rule decided)",
            ["decision", "rule"],
        )
        self.guardian_seconds = HotHistogram(
            "aap_guardian_check_duration_seconds",
            "Time the guardian took to answer a step check, by AOS method",
            ["method"],
            _GUARDIAN_BUCKETS,
        )
        # Every checked step has its check's duration observed: counted from those.
        self.steps = CountOf(
            "aap_steps",
            "Agent steps checked by the guardian, by AOS method",
            self.guardian_seconds,
        )
        registry.register(
            _HotSeries(
                self.requests,
                self.request_seconds,
                self.turns,
                self.turn_seconds,
                self.steps,
                self.verdicts,
                self.guardian_seconds,
            )
        )
        self.open_streams = Gauge(
            "aap_open_streams", "SSE responses being streamed now", registry=registry
        )
        self.pending_approvals = Gauge(
            "aap_pending_approvals",
            "Tool permission requests waiting for an answer (seen by this process; a lapsed one "
            "counts until its session's next turn)",
            registry=registry,
        )
        info = Gauge("aap_build_info", "The server's version", ["version"], registry=registry)
        info.labels(version=version).set(1)

    def request_answered(self, method: str, route: str, status: str, seconds: float) -> None:
        self.request_seconds.observe((method, route, status), seconds)  # counted in `requests`

    def turn_stopped(self, agent: str, stop_reason: str, seconds: float) -> None:
        self.turns.inc((agent, stop_reason))
        self.turn_seconds.observe((agent,), seconds)

    def step_checked(self, method: str, decision: str, rule: str, seconds: float) -> None:
        self.guardian_seconds.observe((method,), seconds)  # counted in `steps` too
        self.verdicts.inc((decision, rule))

    def scrape(self) -> bytes:
        return generate_latest(self.registry)
