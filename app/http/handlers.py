"""ApiError (and every other exception) as an HTTP response in the OpenAI
envelope: the framework side of app.errors."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import ApiError, framework, internal


def _counted(request: Request, err: ApiError) -> None:
    hook = getattr(request.app.state, "on_error", None)  # set by the app's lifespan
    if hook is not None:
        hook(err.status, err.code)


async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    _counted(request, exc)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    err = internal(exc)
    return JSONResponse(err.body(), status_code=err.status)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    err = framework(exc.status_code, str(exc.detail))
    _counted(request, err)
    # Starlette's headers (405's Allow) are kept.
    return JSONResponse(err.body(), status_code=err.status, headers=exc.headers)


def install_handlers(app: FastAPI) -> None:
    """Answer every error, ours or the framework's, in the OpenAI envelope."""
    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
