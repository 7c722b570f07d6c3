"""The API's interactive docs served by the gateway itself, offline: Swagger
UI's assets come from the `swagger-ui-bundle` package, not a CDN (FastAPI's
default page is blank on a host without internet). `/` leads to them."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

ASSETS = "/docs/assets"


def install_docs(app: FastAPI) -> None:
    """GET /docs (Swagger UI on this gateway's /openapi.json) and GET /."""
    app.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="joulegate API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css", swagger_favicon_url="data:,")

    async def root() -> Response:
        return RedirectResponse("/docs")

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    app.add_api_route("/", root, methods=["GET"], include_in_schema=False)
