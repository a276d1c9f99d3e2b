"""The floor a turn is compared with: a bare Litestar app with one JSON POST route, run by
uvicorn with the settings `aap-server serve` uses (no access log, same switch interval).

    python bench/bare_app.py PORT
"""

from __future__ import annotations

import sys

import msgspec
import uvicorn
from litestar import Litestar, post


class Message(msgspec.Struct):
    role: str
    content: str


class TurnRequest(msgspec.Struct):
    messages: list[Message]
    stream: str = "none"


class TurnResponse(msgspec.Struct, rename="camel"):
    stop_reason: str
    messages: list[Message]


@post("/echo", status_code=200)
async def echo(data: TurnRequest) -> TurnResponse:
    return TurnResponse(stop_reason="end_turn", messages=data.messages)


app = Litestar([echo], debug=False)

if __name__ == "__main__":
    sys.setswitchinterval(0.001)  # as `aap-server serve` sets it
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        log_level="warning",
        access_log=False,
        log_config=None,
    )
    uvicorn.Server(config).run()
