"""Prometheus metrics: one registry per app, so two apps in one process (tests) never share
counts. Every label's values come from a bounded set: route templates (not raw paths), hosted
agents, stop reasons, AOS methods, decisions, the policy's rule ids."""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
# No `*_created` series beside every counter and histogram: they double a scrape's size, and
# Prometheus derives resets from the values.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Guardian checks take microseconds to a few milliseconds in process, a remote guardian up to
# its timeout (1 s by default).
_GUARDIAN_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1, 2.5)
# A turn streams a model's whole answer: seconds to minutes.
_TURN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self, version: str) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "aap_http_requests",
            "HTTP requests answered, by method, route template and status",
            ["method", "route", "status"],
            registry=registry,
        )
        self.request_seconds = Histogram(
            "aap_http_request_duration_seconds",
            "Time to answer an HTTP request (a stream: until it ends), by route and status",
            ["method", "route", "status"],
            registry=registry,
        )
        self.turns = Counter(
            "aap_turns",
            "Turns ended, by agent and AAP stop reason",
            ["agent", "stop_reason"],
            registry=registry,
        )
        self.tokens = Counter(
            "aap_model_tokens",
            "Tokens the agents' models reported using, by agent and type (input, output)",
            ["agent", "type"],
            registry=registry,
        )
        self.turn_seconds = Histogram(
            "aap_turn_duration_seconds",
            "Time from a turn's start to its turn_stop, by agent",
            ["agent"],
            buckets=_TURN_BUCKETS,
            registry=registry,
        )
        self.steps = Counter(
            "aap_steps",
            "Agent steps checked by the guardian, by AOS method",
            ["method"],
            registry=registry,
        )
        self.verdicts = Counter(
            "aap_guardian_verdicts",
            "Guardian verdicts, by decision and policy rule id (empty: no rule decided)",
            ["decision", "rule"],
            registry=registry,
        )
        self.guardian_seconds = Histogram(
            "aap_guardian_check_duration_seconds",
            "Time the guardian took to answer a step check, by AOS method",
            ["method"],
            buckets=_GUARDIAN_BUCKETS,
            registry=registry,
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

        # Each check updates three series, each request two, each turn two: their label
        # lookups (a lock and a validation each) are done once per label values.
        self._by_method: dict[str, tuple[Any, Any]] = {}
        self._by_verdict: dict[tuple[str, str], Any] = {}
        self._by_request: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._by_turn: dict[tuple[str, str], tuple[Any, Any]] = {}

    def request_answered(self, method: str, route: str, status: str, seconds: float) -> None:
        labels = (method, route, status)
        series = self._by_request.get(labels)
        if series is None:
            series = self._by_request[labels] = (
                self.requests.labels(*labels),
                self.request_seconds.labels(*labels),
            )
        count, latency = series
        count.inc()
        latency.observe(seconds)

    def turn_stopped(self, agent: str, stop_reason: str, seconds: float) -> None:
        series = self._by_turn.get((agent, stop_reason))
        if series is None:
            series = self._by_turn[agent, stop_reason] = (
                self.turns.labels(agent, stop_reason),
                self.turn_seconds.labels(agent),
            )
        count, duration = series
        count.inc()
        duration.observe(seconds)

    def step_checked(self, method: str, decision: str, rule: str, seconds: float) -> None:
        by_method = self._by_method.get(method)
        if by_method is None:
            by_method = self._by_method[method] = (
                self.steps.labels(method),
                self.guardian_seconds.labels(method),
            )
        steps, latency = by_method
        steps.inc()
        latency.observe(seconds)
        verdict = self._by_verdict.get((decision, rule))
        if verdict is None:
            verdict = self._by_verdict[decision, rule] = self.verdicts.labels(decision, rule)
        verdict.inc()

    def scrape(self) -> bytes:
        return generate_latest(self.registry)
