"""The console: joulegate's own page for a person (live power, the last
requests and their joules, routing and savings, a key's usage), served from
the package, no third-party origin. The page is static; its script reads the
JSON endpoints with the key the person typed, so it sees what that key may
see (app/http/admin.py decides), and never prompt text (no endpoint has it).
"""

from __future__ import annotations

from importlib import resources

from fastapi import Request
from fastapi.responses import Response

from app.errors import ApiError

FILES = {"": ("index.html", "text/html; charset=utf-8"),
         "console.js": ("console.js", "text/javascript; charset=utf-8"),
         "console.css": ("console.css", "text/css; charset=utf-8")}
# Nothing inline, nothing from elsewhere; the page cannot be framed.
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
          "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


async def console(request: Request, name: str = "") -> Response:
    found = FILES.get(name)
    if found is None:
        raise ApiError(404, f"No console file '{name}'", "invalid_request_error", None,
                       "not_found")
    file, media = found
    body = resources.files("app.http.static").joinpath(file).read_bytes()
    return Response(body, media_type=media, headers={
        "content-security-policy": POLICY, "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer", "cache-control": "no-cache"})
