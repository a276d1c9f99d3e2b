"""A guardian reached over HTTP: each step goes out as one AOS JSON-RPC 2.0 request.

The remote is any AOS 0.1 guardian endpoint, e.g. another aap-server's `POST /aos`. Anything
that is not a verdict for this very request (refused connection, timeout, non-200, a JSON-RPC
error, an unreadable body, another id) raises `GuardianUnavailable`; `GuardianChain` then
applies the guardian's fail-closed or fail-open setting.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import msgspec

from aap_server.aos import (
    AosRequest,
    AosSuccessResult,
    JsonRpcError,
    JsonRpcResponse,
    PingParams,
    PingRequest,
    PingResult,
)
from aap_server.guardian.base import Guardian, GuardianStatus, GuardianUnavailable
from aap_server.ids import new_id, utc_now_iso

_encoder = msgspec.json.Encoder()
_reply_decoder = msgspec.json.Decoder(JsonRpcResponse[AosSuccessResult])
_ping_decoder = msgspec.json.Decoder(JsonRpcResponse[PingResult])


class RemoteGuardian(Guardian):
    """An AOS guardian at `url`. Its rule ids come back prefixed with its `name`
    (`acme-dlp:pii.block`), so the audit trail says which guardian decided."""

    def __init__(self, url: str, *, name: str, timeout_seconds: float, api_key: str = "") -> None:
        self.url = url
        self.name = name
        self.timeout_seconds = timeout_seconds
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        # One pooled keep-alive client for every step; its own timeout backs up the caller's.
        self._client = httpx.AsyncClient(
            headers=headers, timeout=timeout_seconds, follow_redirects=False
        )

    async def check(self, request: AosRequest) -> AosSuccessResult:
        body = await self._post(_encoder.encode(request))
        try:
            reply = _reply_decoder.decode(body)
        except (msgspec.DecodeError, RecursionError) as error:  # ValidationError included
            raise GuardianUnavailable(
                "guardian.malformed", f"guardian {self.name} answered something not a verdict"
            ) from error
        if reply.error is not None:
            raise self._error_reply(reply.error)
        if reply.result is None or reply.id != request.id:
            raise GuardianUnavailable(
                "guardian.malformed", f"guardian {self.name} answered another request"
            )
        verdict = reply.result
        data = dict(verdict.data or {})
        rule = data.get("ruleId")
        if not isinstance(rule, str) or not rule:
            rule = (verdict.reason_code or [verdict.decision])[0]
        data["ruleId"] = f"{self.name}:{rule}"
        return msgspec.structs.replace(verdict, data=data)

    async def health(self) -> list[GuardianStatus]:
        started = time.perf_counter()
        ping = PingRequest(id=new_id("ping_"), params=PingParams(timestamp=utc_now_iso()))
        try:
            async with asyncio.timeout(self.timeout_seconds):
                reply = _ping_decoder.decode(await self._post(_encoder.encode(ping)))
            if reply.error is not None:
                raise self._error_reply(reply.error)
            if reply.result is None:
                raise GuardianUnavailable("guardian.malformed", "ping answered without a result")
        except TimeoutError:
            return [self._status(False, started, "guardian.timeout: no answer in time")]
        except GuardianUnavailable as failure:
            return [self._status(False, started, f"{failure.reason_code}: {failure}")]
        except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
            return [self._status(False, started, "guardian.malformed: not a ping reply")]
        result = reply.result
        ok = result.status == "connected"
        return [self._status(ok, started, f"{result.status}, version {result.version}")]

    async def close(self) -> None:
        await self._client.aclose()

    async def _post(self, body: bytes) -> bytes:
        try:
            response = await self._client.post(self.url, content=body)
        except httpx.TimeoutException as error:
            raise TimeoutError from error
        except httpx.HTTPError as error:
            raise GuardianUnavailable(
                "guardian.unreachable", f"guardian {self.name} is unreachable"
            ) from error
        if response.status_code != 200:
            raise GuardianUnavailable(
                "guardian.remote_error",
                f"guardian {self.name} answered HTTP {response.status_code}",
            )
        return response.content

    def _error_reply(self, error: JsonRpcError) -> GuardianUnavailable:
        return GuardianUnavailable(
            "guardian.remote_error", f"guardian {self.name} answered JSON-RPC error {error.code}"
        )

    def _status(self, ok: bool, started: float, detail: str) -> GuardianStatus:
        latency_ms = round((time.perf_counter() - started) * 1000, 2)
        return GuardianStatus(
            name=self.name, kind="remote", ok=ok, latency_ms=latency_ms, detail=detail
        )
