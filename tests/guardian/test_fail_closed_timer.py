"""`FailClosed` arms a time budget only for checks that wait: a check that answers at once
(most in-process checks) costs no timer, and every check still fails closed — on a hang, an
exception or a bad verdict, whether it waited first or not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, cast

from aap_server import aos
from aap_server.guardian import FailClosed, Guardian
from aap_server.guardian.aom import AomGuardian
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.runtime.principal import Principal
from aap_server.runtime.steps import StepFactory, aos_agent
from agents.demo import AGENT as DEMO

STEPS = StepFactory(
    agent=aos_agent(DEMO, []),
    session_id="sess_timer",
    turn_id="turn_timer",
    principal=Principal(user_id="u", org_id="o"),
)
ALLOW = aos.AosSuccessResult(decision="allow", message="ok", data={"ruleId": "r"})


class TimerCountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the timers scheduled on it (`call_at`, which `call_later`
    and `asyncio.timeout` go through) and whose clock can be moved on by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.timers = 0
        self.skipped = 0.0

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)

    def time(self) -> float:
        return super().time() + self.skipped


def run(body: Callable[[TimerCountingLoop], Coroutine[Any, Any, Any]]) -> Any:
    loop = TimerCountingLoop()
    try:
        return loop.run_until_complete(body(loop))
    finally:
        loop.close()


class Answering(Guardian):
    """Answers at once (never suspends)."""

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        return ALLOW


class Raising(Guardian):
    """Raises before its first await."""

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        raise RuntimeError("a bug")


class Hanging(Guardian):
    """Waits forever; notes the cancellation that ends the wait."""

    def __init__(self) -> None:
        self.cancelled = False

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


class Waiting(Guardian):
    """Suspends a few times (a yield to the loop, a future's value, a short sleep), then
    answers with what it was handed, or raises, or answers something malformed."""

    def __init__(self, outcome: str = "answer") -> None:
        self.outcome = outcome

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()
        loop.call_soon(future.set_result, "handed over")
        message = await future
        await asyncio.sleep(0.001)
        if self.outcome == "raise":
            raise RuntimeError("a bug after waiting")
        if self.outcome == "malformed":
            return cast(aos.AosSuccessResult, {"decision": "allow"})
        return aos.AosSuccessResult(decision="allow", message=message, data={"ruleId": "w"})


def test_a_check_that_answers_at_once_arms_no_timer() -> None:
    async def body(loop: TimerCountingLoop) -> aos.AosSuccessResult:
        guardian = FailClosed(Answering(), timeout_seconds=2.0)
        verdict = await guardian.check(STEPS.message("user", "hi"))
        assert loop.timers == 0
        return verdict

    assert run(body) == ALLOW


def test_the_default_in_process_guardian_arms_no_timer_for_a_small_step() -> None:
    """What the server runs (the AOM wrapper around the policy guardian), on a chat turn's
    two steps."""

    async def body(loop: TimerCountingLoop) -> list[str]:
        guardian = FailClosed(AomGuardian(PolicyGuardian(default_policy())), 2.0)
        decisions: list[str] = []
        for step in (STEPS.message("user", "hello there"), STEPS.message("agent", "hi!")):
            decisions.append((await guardian.check(step)).decision)
        assert loop.timers == 0
        return decisions

    assert run(body) == ["allow", "allow"]


def test_a_check_that_waits_forever_is_denied_at_the_timeout() -> None:
    hanging = Hanging()

    async def body(loop: TimerCountingLoop) -> aos.AosSuccessResult:
        return await FailClosed(hanging, timeout_seconds=0.05).check(STEPS.message("user", "hi"))

    verdict = run(body)
    assert verdict.decision == "deny"
    assert verdict.reason_code == ["guardian.timeout"]
    assert hanging.cancelled  # the check itself was told to stop (its scan stops too)


def test_a_synchronous_check_that_raises_is_denied() -> None:
    async def body(loop: TimerCountingLoop) -> aos.AosSuccessResult:
        return await FailClosed(Raising(), timeout_seconds=2.0).check(STEPS.message("user", "hi"))

    verdict = run(body)
    assert verdict.decision == "deny"
    assert verdict.reason_code == ["guardian.error"]


def test_a_check_that_waits_gets_what_it_waited_for_and_fails_closed_after() -> None:
    async def body(loop: TimerCountingLoop) -> list[aos.AosSuccessResult]:
        return [
            await FailClosed(Waiting(outcome), timeout_seconds=2.0).check(
                STEPS.message("user", "hi")
            )
            for outcome in ("answer", "raise", "malformed")
        ]

    answered, raised, malformed = run(body)
    assert (answered.decision, answered.message) == ("allow", "handed over")
    assert (raised.decision, raised.reason_code) == ("deny", ["guardian.error"])
    assert (malformed.decision, malformed.reason_code) == ("deny", ["guardian.malformed"])


class SlowThenWaiting(Guardian):
    """Spends (pretended) seconds before its first await, then waits briefly and allows."""

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        loop = cast(TimerCountingLoop, asyncio.get_running_loop())
        loop.skipped += 10.0  # as if the synchronous part had run for 10 s
        await asyncio.sleep(0.01)
        return ALLOW


def test_the_time_budget_counts_from_the_start_of_the_check_not_its_first_wait() -> None:
    async def body(loop: TimerCountingLoop) -> aos.AosSuccessResult:
        return await FailClosed(SlowThenWaiting(), timeout_seconds=1.0).check(
            STEPS.message("user", "hi")
        )

    verdict = run(body)
    assert (verdict.decision, verdict.reason_code) == ("deny", ["guardian.timeout"])


def test_cancelling_the_caller_cancels_a_waiting_check() -> None:
    """A turn cancelled while its check waits: the check is cancelled too, and the
    cancellation is not taken for a verdict."""
    hanging = Hanging()

    async def body(loop: TimerCountingLoop) -> bool:
        task = asyncio.ensure_future(
            FailClosed(hanging, timeout_seconds=60).check(STEPS.message("user", "hi"))
        )
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False  # it answered (after its 60 s budget): the cancellation was lost

    assert run(body)
    assert hanging.cancelled


class Yielding(Guardian):
    """Lets the loop run `passes` passes (`asyncio.sleep(0)`, as `LoopSlice` does once a pass
    has had its inline scan budget), each pretending `seconds_per_pass` went by, then allows;
    notes whether it was closed (or cancelled) before answering."""

    def __init__(self, passes: float, seconds_per_pass: float = 0.0) -> None:
        self.passes = passes
        self.seconds_per_pass = seconds_per_pass
        self.stopped = False

    async def check(self, request: aos.AosRequest) -> aos.AosSuccessResult:
        loop = cast(TimerCountingLoop, asyncio.get_running_loop())
        taken = 0
        try:
            while taken < self.passes:
                await asyncio.sleep(0)
                loop.skipped += self.seconds_per_pass
                taken += 1
        except (GeneratorExit, asyncio.CancelledError):
            self.stopped = True
            raise
        return ALLOW


def test_a_check_that_only_lets_the_loop_run_a_pass_arms_no_timer() -> None:
    """A big turn's check yields a loop pass when the pass's inline scan budget is spent:
    the pass is taken without a timer, and the check's answer is its verdict."""

    async def body(loop: TimerCountingLoop) -> aos.AosSuccessResult:
        verdict = await FailClosed(Yielding(3), timeout_seconds=2.0).check(
            STEPS.message("user", "hi")
        )
        assert loop.timers == 0
        return verdict

    assert run(body) == ALLOW


def test_a_check_that_yields_loop_passes_forever_is_denied_at_the_timeout() -> None:
    """No timer guards those passes, so the budget is read after each: a check that never
    stops yielding is ended (and told so) once its time is up."""
    yielding = Yielding(float("inf"), seconds_per_pass=0.4)

    async def body(loop: TimerCountingLoop) -> aos.AosSuccessResult:
        return await FailClosed(yielding, timeout_seconds=1.0).check(STEPS.message("user", "hi"))

    verdict = run(body)
    assert (verdict.decision, verdict.reason_code) == ("deny", ["guardian.timeout"])
    assert yielding.stopped


def test_cancelling_the_caller_during_a_loop_pass_stops_the_check() -> None:
    yielding = Yielding(float("inf"))

    async def body(loop: TimerCountingLoop) -> bool:
        task = asyncio.ensure_future(
            FailClosed(yielding, timeout_seconds=60).check(STEPS.message("user", "hi"))
        )
        for _ in range(5):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert run(body)
    assert yielding.stopped
