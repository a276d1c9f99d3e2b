"""What one AOM request (`aom_read_surface`/`aom_invoke` fetching a surface) costs over a bare
GET on one shared httpx client, against a local HTTP server, in the same run. Each AOM request
opens its own client; the TLS settings (CA bundle) are built once, not per request.

    python bench/aom.py [--runs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aap_server.toolkits.aom import AomLimits, _fetch_json
from bench._common import p99


class Surface(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


async def timed(fetch: Callable[[], Awaitable[Any]], runs: int) -> list[float]:
    for _ in range(5):  # warm-up
        await fetch()
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        await fetch()
        times.append(time.perf_counter() - began)
    return times


async def main(runs: int) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Surface)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/surface"
    async with httpx.AsyncClient() as client:
        bare = await timed(lambda: client.get(url), runs)
    limits = AomLimits()  # the defaults the built-in tools use
    aom = await timed(lambda: _fetch_json(limits, "GET", url), runs)
    server.shutdown()
    print(f"{runs} GETs of a small surface on loopback (median / p99):")
    for name, times in (("shared httpx client", bare), ("AOM request", aom)):
        print(
            f"  {name:20} {statistics.median(times) * 1000:7.2f} ms / {p99(times) * 1000:7.2f} ms"
        )
    print(f"  ratio                {statistics.median(aom) / statistics.median(bare):7.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    asyncio.run(main(parser.parse_args().runs))
