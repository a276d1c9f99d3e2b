"""The turn engine under agents that misbehave, in every stream mode: a `none` turn runs in
the request's own task (no task, queue hand-off or timeout scope of its own), and still
keeps every rule a turn in its own task keeps: the timeout cuts an agent that awaits, a
shutdown stops it with `turn_stop` `error`, any cancellation stores it and frees the session
exactly once, and its timer never fires into the request once the turn has ended."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from aap_server.agent import (
    Agent,
    AgentCapabilities,
    Empty,
    HistoryCapabilities,
    ModelOutput,
    ModelRequest,
    StreamCapabilities,
    TextDelta,
    TurnModel,
)
from aap_server.guardian.policy import default_policy
from aap_server.guardian.policy_guardian import PolicyGuardian
from aap_server.protocol import (
    AgentConfig,
    HistoryMessage,
    PostSessionsRequest,
    PostSessionTurnRequest,
    PostSessionTurnResponse,
    StreamMode,
    TextDeltaEvent,
    TurnStopEvent,
    UserMessage,
)
from aap_server.runtime import LOCAL_PRINCIPAL, AapService, AgentRegistry
from aap_server.runtime.views import none_answer
from aap_server.store import SqliteSessionStore
from tests.conftest import tiny_agent

Respond = Callable[[ModelRequest], AsyncIterator[ModelOutput]]


class Scripted(TurnModel):
    def __init__(self) -> None:
        self.respond_with: Respond | None = None
        self.started = asyncio.Event()

    async def respond(self, request: ModelRequest) -> AsyncIterator[ModelOutput]:
        self.started.set()
        assert self.respond_with is not None
        async for output in self.respond_with(request):
            yield output


def agent(model: TurnModel) -> Agent:
    return tiny_agent(
        "scripted",
        instructions="",
        model=model,
        capabilities=AgentCapabilities(
            stream=StreamCapabilities(delta=Empty(), message=Empty(), none=Empty()),
            history=HistoryCapabilities(compacted=Empty(), full=Empty()),
        ),
    )


async def echo(request: ModelRequest) -> AsyncIterator[ModelOutput]:
    last = request.history[-1]
    assert isinstance(last, UserMessage)
    assert isinstance(last.content, str)
    yield TextDelta(text=f"Echo: {last.content}")


async def forever(request: ModelRequest) -> AsyncIterator[ModelOutput]:
    yield TextDelta(text="never said")
    await asyncio.Event().wait()


async def raises(request: ModelRequest) -> AsyncIterator[ModelOutput]:
    yield TextDelta(text="half")
    raise RuntimeError("the model broke")


async def nothing(request: ModelRequest) -> AsyncIterator[ModelOutput]:
    return
    yield  # an async generator that yields nothing


async def many_deltas(request: ModelRequest) -> AsyncIterator[ModelOutput]:
    for index in range(10_000):
        yield TextDelta(text=f"{index % 10}")


class Engine:
    def __init__(self, service: AapService, model: Scripted, session_id: str) -> None:
        self.service = service
        self.model = model
        self.session_id = session_id

    async def turn(self, text: str, mode: StreamMode = "none") -> tuple[str, list[Any]]:
        """The turn's stop reason and, for `none`, its messages (else every event)."""
        request = PostSessionTurnRequest(stream=mode, messages=[UserMessage(content=text)])
        turn = await self.service.start_turn(LOCAL_PRINCIPAL, self.session_id, request)
        if mode == "none":
            answer = await none_answer(turn.queue)
            return answer.stop_reason, answer.messages
        events = [event async for event in turn.events()]
        stop = events[-1]
        assert isinstance(stop, TurnStopEvent)
        return stop.stop_reason, events

    async def full(self) -> list[HistoryMessage]:
        page = await self.service.history_page(
            LOCAL_PRINCIPAL, self.session_id, "full", None, 1000, 10_000_000
        )
        return page.messages

    async def free(self) -> bool:
        """Nothing of a turn is held: the session, the principal's slot, the turn's task
        (a streamed turn's task ends a few loop passes after its last event)."""
        for _ in range(10):
            await asyncio.sleep(0)
        owner = LOCAL_PRINCIPAL.owner
        return (
            not self.service._active
            and not self.service._tasks
            and not self.service.principal_limits._turns.get(owner)
        )


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    store = SqliteSessionStore(str(tmp_path / "engine.db"))
    await store.open()
    model = Scripted()
    service = AapService(
        registry=AgentRegistry([agent(model)]),
        store=store,
        guardian=PolicyGuardian(default_policy()),
        # Long enough for an echo turn on a loaded CI machine, short enough to wait out.
        turn_timeout_seconds=1.0,
    )
    created = await service.create_session(
        LOCAL_PRINCIPAL, PostSessionsRequest(agent=AgentConfig(name="scripted"))
    )
    yield Engine(service, model, created.session_id)
    await service.shutdown(0)
    await store.close()


def texts(messages: list[HistoryMessage]) -> list[Any]:
    return [message.content for message in messages]


async def test_a_none_turn_runs_in_the_requests_task(engine: Engine) -> None:
    engine.model.respond_with = echo
    loop = asyncio.get_running_loop()
    made: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        reason, messages = await engine.turn("hi")
        assert not [name for name in made if name.startswith("AapService")], made
        assert (reason, texts(messages)) == ("end_turn", ["Echo: hi"])
        await engine.turn("streamed", "delta")  # a streamed turn has its own task
        assert "AapService._finish" in made
    finally:
        loop.set_task_factory(None)
    assert await engine.free()


@pytest.mark.parametrize("mode", ["none", "delta", "message"])
async def test_an_agent_awaiting_past_the_timeout_is_cut_off(
    engine: Engine, mode: StreamMode
) -> None:
    engine.model.respond_with = forever
    reason, _ = await engine.turn("wait", mode)
    assert reason == "error"
    assert texts(await engine.full()) == ["wait"]  # the input stays, nothing unchecked is said
    assert await engine.free()
    # The request's task was not left cancelled (the timer's cancellation was taken back),
    # and the timer is gone: the request goes on past the turn's timeout undisturbed.
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    await asyncio.sleep(1.2)
    engine.model.respond_with = echo
    reason, messages = await engine.turn("again")
    assert (reason, texts(messages)) == ("end_turn", ["Echo: again"])


async def test_the_timer_of_a_finished_turn_never_cancels_the_request(engine: Engine) -> None:
    engine.model.respond_with = echo
    for index in range(5):
        assert (await engine.turn(f"quick {index}"))[0] == "end_turn"
    await asyncio.sleep(1.2)  # past every one of those turns' timeouts: nothing cancels this
    assert len(await engine.full()) == 10


@pytest.mark.parametrize("mode", ["none", "delta"])
async def test_an_agent_that_raises_ends_the_turn_with_error(
    engine: Engine, mode: StreamMode
) -> None:
    engine.model.respond_with = raises
    reason, _ = await engine.turn("break", mode)
    assert reason == "error"
    assert texts(await engine.full()) == ["break"]  # its unchecked "half" was never said
    assert await engine.free()


@pytest.mark.parametrize("mode", ["none", "delta"])
async def test_an_agent_that_says_nothing_ends_the_turn(engine: Engine, mode: StreamMode) -> None:
    engine.model.respond_with = nothing
    reason, out = await engine.turn("silence", mode)
    assert reason == "end_turn"
    if mode == "none":
        assert out == []
    assert texts(await engine.full()) == ["silence"]
    assert await engine.free()


@pytest.mark.parametrize("mode", ["none", "message", "delta"])
async def test_ten_thousand_deltas_make_one_message(engine: Engine, mode: StreamMode) -> None:
    engine.model.respond_with = many_deltas
    said = "".join(f"{index % 10}" for index in range(10_000))
    reason, out = await engine.turn("count", mode)
    assert reason == "end_turn"
    if mode == "none":
        assert texts(out) == [said]
    elif mode == "delta":
        assert "".join(e.delta for e in out if isinstance(e, TextDeltaEvent)) == said
    else:  # no client reads deltas: the engine makes none, whatever the agent sends
        assert [type(e).__name__ for e in out] == [
            "TurnStartEvent",
            "AssistantText",
            "MessageOut",
            "TurnStopEvent",
        ]
    assert texts(await engine.full()) == ["count", said]
    assert await engine.free()


async def runtime_calls_in_turn(engine: Engine, deltas: int, mode: StreamMode) -> int:
    """Python calls into the runtime's code while a turn of `deltas` text deltas runs."""

    async def respond(request: ModelRequest) -> AsyncIterator[ModelOutput]:
        for _ in range(deltas):
            yield TextDelta(text="x")

    engine.model.respond_with = respond
    calls = 0

    def count(frame: Any, event: str, _: object) -> None:
        nonlocal calls
        if event == "call" and "aap_server/runtime/" in frame.f_code.co_filename:
            calls += 1

    sys.setprofile(count)
    try:
        reason, _ = await engine.turn("count", mode)
    finally:
        sys.setprofile(None)
    assert reason == "end_turn"
    return calls


@pytest.mark.parametrize("mode", ["none", "message"])
async def test_a_held_delta_costs_no_python_call_in_the_runtime(
    engine: Engine, mode: StreamMode
) -> None:
    """Where no client sees deltas, the runtime only collects them: 10,000 deltas make about
    as many runtime calls as 10 do (each made one call more, a `Held.feed`)."""
    few = await runtime_calls_in_turn(engine, 10, mode)
    many = await runtime_calls_in_turn(engine, 10_000, mode)
    assert many - few < 100, (few, many)


async def started_turn(engine: Engine, text: str) -> asyncio.Task[PostSessionTurnResponse]:
    """A `none` turn in a task of its own (as a request's), once its agent is responding."""
    engine.model.respond_with = forever
    engine.model.started.clear()

    async def request() -> PostSessionTurnResponse:
        turn = await engine.service.start_turn(
            LOCAL_PRINCIPAL,
            engine.session_id,
            PostSessionTurnRequest(messages=[UserMessage(content=text)]),
        )
        return await none_answer(turn.queue)

    task = asyncio.create_task(request())
    await asyncio.wait_for(engine.model.started.wait(), 5)
    return task


async def test_shutdown_stops_a_none_turn_which_answers_with_error(engine: Engine) -> None:
    engine.service.turn_timeout_seconds = 60
    request = await started_turn(engine, "stopped")
    await engine.service.shutdown(0.05)
    answer = await request  # answered, not cancelled
    assert (answer.stop_reason, answer.messages) == ("error", [])
    assert texts(await engine.full()) == ["stopped"]
    assert await engine.free()


async def test_a_cancelled_request_stores_its_none_turn_and_frees_the_session_once(
    engine: Engine,
) -> None:
    engine.service.turn_timeout_seconds = 60
    request = await started_turn(engine, "cancelled")
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert texts(await engine.full()) == ["cancelled"]
    assert await engine.free()
    engine.model.respond_with = echo
    reason, messages = await engine.turn("after")
    assert (reason, texts(messages)) == ("end_turn", ["Echo: after"])
    assert await engine.free()  # freed once: a second release would have gone negative or raised


async def test_one_timer_cuts_each_turn_at_its_own_deadline(engine: Engine) -> None:
    """Deadlines share one timer: a later turn with an earlier deadline is cut first, the
    earlier one still at its own, and turns that end in time are never cut."""
    service = engine.service
    other = await service.create_session(
        LOCAL_PRINCIPAL, PostSessionsRequest(agent=AgentConfig(name="scripted"))
    )
    engine.model.respond_with = forever
    service.turn_timeout_seconds = 4.0
    first = asyncio.create_task(engine.turn("slow deadline"))
    await asyncio.wait_for(engine.model.started.wait(), 5)
    service.turn_timeout_seconds = 0.5
    second = asyncio.create_task(Engine(service, engine.model, other.session_id).turn("soon"))
    assert (await second)[0] == "error"
    assert not first.done()  # cut at its own deadline, not at the other's
    assert len(service._deadlines.running) == 1
    assert (await first)[0] == "error"
    engine.model.respond_with = echo
    service.turn_timeout_seconds = 1.0
    for index in range(3):  # each within its deadline: the timer left for it cuts nothing
        assert (await engine.turn(f"quick {index}"))[0] == "end_turn"
    await asyncio.sleep(1.2)
    assert not service._deadlines.running
    assert await engine.free()


async def test_a_client_hanging_up_on_a_none_turn_over_http_does_not_stop_it(
    tmp_path: Path,
) -> None:
    """The inline `none` turn runs in the request's task: uvicorn does not cancel that task
    when the client goes away, so the turn runs to its end and stores its reply."""
    from aap_server.api.app import create_app
    from aap_server.config import Settings
    from tests.conftest import serve, wait_until

    model = Scripted()
    gate = asyncio.Event()

    async def gated(request: ModelRequest) -> AsyncIterator[ModelOutput]:
        await gate.wait()
        yield TextDelta(text="said after the hang-up")

    model.respond_with = gated
    app = create_app(Settings(db=str(tmp_path / "http.db")), [agent(model)])
    service: AapService = app.state.service
    async with serve(app) as base_url, httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        created = await client.post("/sessions", json={"agent": {"name": "scripted"}})
        session_id = created.json()["sessionId"]
        body = {"messages": [{"role": "user", "content": "hello"}]}
        request = asyncio.create_task(client.post(f"/sessions/{session_id}/turns", json=body))
        await asyncio.wait_for(model.started.wait(), 5)
        request.cancel()  # the client hangs up mid-turn
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.sleep(0.1)  # the server sees the connection close
        gate.set()
        await wait_until(lambda: not service._active, within=5)
        history = await client.get(f"/sessions/{session_id}/history", params={"type": "full"})
        contents = [m["content"] for m in history.json()["history"]["full"]]
        assert contents == ["hello", "said after the hang-up"]
