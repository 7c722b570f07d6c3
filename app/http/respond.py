"""Forwarding's answers as Starlette responses."""

from __future__ import annotations

from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from app.forward.answer import Answer, Streamed


class JsonAnswer(Response):
    """A response with a JSON body and the gateway's own headers (lower-case
    names): Starlette's Response, without its general header handling."""

    media_type = "application/json"

    def __init__(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.status_code = status
        self.background = None
        self.body = body
        self.raw_headers = [(b"content-length", str(len(body)).encode()),
                            (b"content-type", b"application/json"),
                            *((k.encode("latin-1"), v.encode("latin-1"))
                              for k, v in headers.items())]


def response(answer: Answer) -> Response:
    if isinstance(answer, Streamed):
        # The background task ends the exchange even if the client left before
        # the stream was ever iterated (the generator's own exit never ran).
        return StreamingResponse(answer.events, media_type="text/event-stream",
                                 headers=answer.headers, background=BackgroundTask(answer.end))
    if answer.media_type is None:
        return Response(status_code=answer.status, headers=answer.headers)
    return JsonAnswer(answer.status, answer.body, answer.headers)
