"""What the runtime reports, and what becomes of it: metrics always, spans when tracing is on.

The runtime reports a turn's start and stop (`Telemetry.turn_started`, `TurnObservation.stopped`)
and each guardian check (`observe_step`, found through a context variable, so the check
wrapper needs no handle passed down). Spans nest as AOS's OpenTelemetry mapping describes: the
HTTP request, then the turn (keyed by `turnId`), then its steps (keyed by `stepId`). They are
named and attributed with the OpenTelemetry GenAI conventions (`gen_ai.*`) plus `aos.*` for the
guardian's verdict. Message content, tool inputs and option values are never recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

from aap_server import aos
from aap_server.telemetry.context import current_request
from aap_server.telemetry.metrics import Metrics

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from aap_server.agent import Agent, Usage

logger = logging.getLogger("aap_server.turn")


class Telemetry:
    """One app's metrics and (optional) tracer."""

    def __init__(self, version: str = "0.0.0", tracer: Tracer | None = None) -> None:
        self.metrics = Metrics(version)
        self.tracer = tracer
        self._awaiting: dict[str, int] = {}  # session id -> permission requests it awaits

    def turn_started(
        self, agent: Agent, session_id: str, turn_id: str, mode: str
    ) -> TurnObservation:
        return TurnObservation(self, agent, session_id, turn_id, mode)

    def session_scope(self, agent: Agent, session_id: str) -> Observer:
        """Checks outside a turn (a new session's seed and options): metrics, and step spans
        under the request's span."""
        return Observer(self, agent, session_id, "", _request_span())

    def awaiting_approvals(self, session_id: str, count: int) -> None:
        """The session now awaits `count` permission requests (0: none)."""
        before = self._awaiting.pop(session_id, 0)
        if count:
            self._awaiting[session_id] = count
        if count != before:
            self.metrics.pending_approvals.inc(count - before)


def _request_span() -> Any:
    request = current_request.get()
    return request.span if request is not None else None


_observer: ContextVar[Observer | None] = ContextVar("aap_observer", default=None)


class Observer:
    """Where the guardian checks made in its scope are reported."""

    def __init__(
        self, telemetry: Telemetry, agent: Agent, session_id: str, turn_id: str, span: Any
    ) -> None:
        self.telemetry = telemetry
        self.agent = agent
        self.session_id = session_id
        self.turn_id = turn_id
        self.span: Span | None = span  # the parent of step spans
        self.steps = 0

    def enter(self) -> Token[Observer | None]:
        return _observer.set(self)

    def leave(self, token: Token[Observer | None]) -> None:
        _observer.reset(token)

    @contextmanager
    def scoped(self) -> Iterator[None]:
        """The checks made inside the `with` are reported here."""
        token = self.enter()
        try:
            yield
        finally:
            self.leave(token)

    def step(
        self,
        request: aos.AosRequest,
        verdict: aos.AosSuccessResult,
        rule_id: str | None,
        latency_ns: int,
        method: str | None = None,
    ) -> None:
        """`method`: the request's, if the caller has it (else read from `request`)."""
        self.steps += 1
        telemetry = self.telemetry
        telemetry.metrics.step_checked(
            method or request.method, verdict.decision, rule_id or "", latency_ns / 1e9
        )
        if telemetry.tracer is not None:
            self._step_span(telemetry.tracer, request, verdict, rule_id, latency_ns)

    def _step_span(
        self,
        tracer: Tracer,
        request: aos.AosRequest,
        verdict: aos.AosSuccessResult,
        rule_id: str | None,
        latency_ns: int,
    ) -> None:
        from opentelemetry.trace import set_span_in_context

        ended_ns = time.time_ns()  # the check just ended: its span is drawn back from now

        attributes: dict[str, Any] = {
            "aos.method": request.method,
            "aos.step_id": str(request.id),
            "gen_ai.agent.name": self.agent.name,
            "gen_ai.conversation.id": self.session_id,
            "aos.guardian.decision": verdict.decision,
            "aos.guardian.latency_ms": latency_ns / 1e6,
        }
        if self.turn_id:
            attributes["aos.turn_id"] = self.turn_id
        if rule_id:
            attributes["aos.guardian.rule_id"] = rule_id
        if verdict.reason_code:
            attributes["aos.guardian.reason_codes"] = list(verdict.reason_code)
        name = request.method
        params: Any = request.params
        if isinstance(request, aos.MessageStep):
            attributes["aos.message.role"] = params.message.role
            name = f"{name} {params.message.role}"
        elif isinstance(request, aos.ToolCallRequestStep):
            call = params.tool_call_request
            attributes["gen_ai.tool.name"] = call.tool_id
            attributes["gen_ai.tool.call.id"] = call.execution_id
            name = f"{name} {call.tool_id}"
        elif isinstance(request, aos.ToolCallResultStep):
            execution_id = params.execution_id or (
                params.tool_call_result.execution_id if params.tool_call_result else None
            )
            if execution_id:
                attributes["gen_ai.tool.call.id"] = execution_id
        request_id = current_request.get()
        if request_id is not None:
            attributes["aap.request.id"] = request_id.request_id
        parent = set_span_in_context(self.span) if self.span is not None else None
        span = tracer.start_span(
            name, context=parent, start_time=ended_ns - latency_ns, attributes=attributes
        )
        span.end(end_time=ended_ns)


def observe_step(
    request: aos.AosRequest,
    verdict: aos.AosSuccessResult,
    rule_id: str | None,
    latency_ns: int,
    method: str | None = None,
) -> None:
    """Report a guardian check that just ended to the observer in scope (if any)."""
    observer = _observer.get()
    if observer is not None:
        observer.step(request, verdict, rule_id, latency_ns, method)


class TurnObservation(Observer):
    """One turn: its span (child of the request's), its log lines, its metrics at the stop."""

    def __init__(
        self, telemetry: Telemetry, agent: Agent, session_id: str, turn_id: str, mode: str
    ) -> None:
        self.started = time.perf_counter()
        span = None
        tracer = telemetry.tracer
        if tracer is not None:
            span = self._turn_span(tracer, agent, session_id, turn_id, mode)
        super().__init__(telemetry, agent, session_id, turn_id, span)
        if not logger.isEnabledFor(logging.INFO):  # else skip building its fields
            return
        logger.info(
            "turn %s started: agent %s, session %s, stream %s",
            turn_id,
            agent.name,
            session_id,
            mode,
            extra={"turn_id": turn_id, "session_id": session_id, "agent": agent.name},
        )

    @staticmethod
    def _turn_span(tracer: Tracer, agent: Agent, session_id: str, turn_id: str, mode: str) -> Span:
        from opentelemetry.trace import SpanKind, set_span_in_context

        model = agent.model_info
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent.name,
            "gen_ai.conversation.id": session_id,
            "gen_ai.request.model": model.name,
            "gen_ai.provider.name": model.provider.name,
            "aos.turn_id": turn_id,
            "aap.stream": mode,
        }
        request = current_request.get()
        parent = None
        if request is not None:
            attributes["aap.request.id"] = request.request_id
            if request.span is not None:
                parent = set_span_in_context(request.span)
        return tracer.start_span(
            f"invoke_agent {agent.name}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )

    def stopped(self, reason: str, awaiting_approvals: int, usage: Usage | None = None) -> None:
        """The turn emitted `turn_stop` with `reason`; the session now awaits
        `awaiting_approvals` permission requests; its model reported using `usage` tokens."""
        seconds = time.perf_counter() - self.started
        metrics = self.telemetry.metrics
        metrics.turn_stopped(self.agent.name, reason, seconds)
        input_tokens = usage.input_tokens if usage is not None else 0
        output_tokens = usage.output_tokens if usage is not None else 0
        if input_tokens or output_tokens:
            metrics.tokens.labels(self.agent.name, "input").inc(input_tokens)
            metrics.tokens.labels(self.agent.name, "output").inc(output_tokens)
        self.telemetry.awaiting_approvals(self.session_id, awaiting_approvals)
        if self.span is not None:
            self.span.set_attribute("gen_ai.response.finish_reasons", [reason])
            self.span.set_attribute("aos.steps", self.steps)
            if input_tokens or output_tokens:
                self.span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
                self.span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
            if reason == "error":
                from opentelemetry.trace import StatusCode

                self.span.set_status(StatusCode.ERROR, "the turn stopped with an error")
            self.span.end()
        if not logger.isEnabledFor(logging.INFO):
            return
        logger.info(
            "turn %s stopped: %s after %.1f ms, %d guardian checks, %d + %d tokens",
            self.turn_id,
            reason,
            seconds * 1000,
            self.steps,
            input_tokens,
            output_tokens,
            extra={
                "turn_id": self.turn_id,
                "stop_reason": reason,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
            },
        )

    def rejected(self, error: BaseException) -> None:
        """The turn was refused before it started (an HTTP error answered it)."""
        if self.span is not None:
            from opentelemetry.trace import StatusCode

            self.span.set_attribute("error.type", type(error).__name__)
            self.span.set_status(StatusCode.ERROR, type(error).__name__)
            self.span.end()
        logger.info(
            "turn %s refused before it started: %s",
            self.turn_id,
            type(error).__name__,
            extra={"turn_id": self.turn_id},
        )
