"""The Python floor for a gateway: a bare FastAPI app that forwards each
chat request to one upstream with aiohttp and returns its answer (streamed
answers relayed chunk by chunk), under uvicorn with the options joulegate
runs (httptools, uvloop where installed, no access log). No routing, no
metering, no validation: what any Python gateway pays before doing its work.

    python -m bench.passthrough --port 8300 --upstream http://127.0.0.1:8200 [--workers N]

`--workers N`: N processes on the one port (uvicorn's own supervisor, as
`joulegate serve --workers N` is measured beside it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse


def make_app(upstream: str) -> FastAPI:
    session: dict[str, aiohttp.ClientSession] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        session["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
        yield
        await session["s"].close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.body()
        streamed = b'"stream": true' in body or b'"stream":true' in body
        path = "/sse/v1/chat/completions" if streamed else "/json/v1/chat/completions"
        r = await session["s"].post(upstream + path, data=body,
                                    headers={"content-type": "application/json"})
        if not streamed:
            data = await r.read()
            r.release()
            return Response(data, status_code=r.status, media_type="application/json")

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in r.content.iter_any():
                    yield chunk
            finally:
                r.release()
        return StreamingResponse(relay(), media_type="text/event-stream")

    @app.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    return app


UPSTREAM_ENV = "PASSTHROUGH_UPSTREAM"


def app_from_env() -> FastAPI:
    """The app of a worker process started by uvicorn's supervisor."""
    return make_app(os.environ[UPSTREAM_ENV])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    try:
        import uvloop  # noqa: F401
        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    options: dict[str, Any] = {"host": "127.0.0.1", "port": args.port, "http": "httptools",
                               "loop": loop, "access_log": False, "log_level": "warning"}
    if args.workers > 1:
        os.environ[UPSTREAM_ENV] = args.upstream
        uvicorn.run("bench.passthrough:app_from_env", factory=True, workers=args.workers,
                    **options)
    else:
        uvicorn.run(make_app(args.upstream), **options)


if __name__ == "__main__":
    main()
