"""The HTTP surface's table: every path, its method and its handler."""

from __future__ import annotations

from fastapi import APIRouter

from app.http import admin, chat, console, health
from app.http.openapi import ERROR_RESPONSES, OK_RESPONSE, TEXT_RESPONSE, request_body
from app.http.requests import ChatRequest, CompletionRequest, NewKey


def build_routes() -> APIRouter:
    api = APIRouter()
    generation = {**OK_RESPONSE, **ERROR_RESPONSES}
    api.add_api_route("/v1/chat/completions", chat.chat, methods=["POST"],
                      openapi_extra=request_body(ChatRequest), responses=generation)
    api.add_api_route("/v1/completions", chat.completions, methods=["POST"],
                      openapi_extra=request_body(CompletionRequest), responses=generation)
    api.add_api_route("/v1/route", chat.route, methods=["POST"],
                      openapi_extra=request_body(ChatRequest), responses=ERROR_RESPONSES)
    api.add_api_route("/v1/models", health.models, methods=["GET"],
                      responses=ERROR_RESPONSES)
    api.add_api_route("/v1/energy/{device}/{wid}", admin.energy, methods=["GET"],
                      responses=ERROR_RESPONSES)
    api.add_api_route("/v1/usage", admin.usage, methods=["GET"], responses=ERROR_RESPONSES)
    api.add_api_route("/v1/report", admin.report, methods=["GET"], responses=ERROR_RESPONSES)
    api.add_api_route("/v1/admin/keys", admin.list_keys, methods=["GET"],
                      responses=ERROR_RESPONSES)
    api.add_api_route("/v1/admin/keys", admin.create_key, methods=["POST"],
                      openapi_extra=request_body(NewKey),
                      responses={201: {"description": "The new key, shown once"},
                                 **ERROR_RESPONSES})
    api.add_api_route("/v1/admin/keys/{name}/revoke", admin.revoke_key, methods=["POST"],
                      responses=ERROR_RESPONSES)
    api.add_api_route("/healthz", health.healthz, methods=["GET"])
    api.add_api_route("/readyz", health.readyz, methods=["GET"], responses={503: {
        "description": "Not ready: no backend can take requests (the same body)"}})
    api.add_api_route("/metrics", health.metrics, methods=["GET"], responses=TEXT_RESPONSE)
    api.add_api_route("/console", console.console, methods=["GET"], include_in_schema=False)
    api.add_api_route("/console/{name}", console.console, methods=["GET"],
                      include_in_schema=False)
    return api
