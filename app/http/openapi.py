"""The served OpenAPI document: real request-body schemas and the error envelope.

Handlers read their bodies themselves (unknown fields are forwarded, bad JSON
gets an OpenAI error, not FastAPI's 422), so FastAPI cannot infer the bodies;
they are declared here from the same pydantic models that validate them.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"]},
            "code": {"type": ["string", "null"]},
        },
    }},
}

_ERRORS = {
    400: "Invalid request", 401: "Missing or unknown API key",
    403: "Not allowed for this key", 404: "Unknown model or record", 409: "Exists already",
    413: "Body too large",
    415: "Not application/json", 429: "At capacity (Retry-After)",
    502: "Worker failed", 503: "No healthy worker (Retry-After)", 504: "Worker timed out",
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"description": text,
           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for code, text in _ERRORS.items()
}


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body `model` validates."""
    schema = model.model_json_schema(ref_template=_REF)
    schema.pop("$defs", None)
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}}}


OK_RESPONSE: dict[int | str, dict[str, Any]] = {200: {
    "description": "The answer: JSON, or server-sent events when `stream` is true",
    "content": {"application/json": {"schema": {"type": "object"}},
                "text/event-stream": {}}}}
TEXT_RESPONSE: dict[int | str, dict[str, Any]] = {200: {
    "description": "Prometheus text exposition", "content": {"text/plain": {}}}}


def install_openapi(app: FastAPI, models: list[type[BaseModel]], model_names: list[str],
                    max_tokens: int) -> None:
    """Serve the document with the body models' definitions and the error schema.

    The document describes this deployment: `model` is one of the names it
    serves and token limits stop at its largest context, so that clients and
    fuzzers generate requests it can answer."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title="joulegate", version="0.1.0", routes=app.routes,
                          description="OpenAI-compatible, energy-aware LLM gateway")
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        schemas["Error"] = ERROR_SCHEMA
        for model in models:
            schemas.update(model.model_json_schema(ref_template=_REF).get("$defs", {}))
        for path in doc.get("paths", {}).values():
            for op in path.values():
                op.get("responses", {}).pop("422", None)  # FastAPI's own; never sent
                body = op.get("requestBody", {}).get("content", {}).get("application/json")
                if body is not None:
                    _describe_deployment(body["schema"], model_names, max_tokens)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _describe_deployment(schema: dict[str, Any], model_names: list[str], max_tokens: int
                         ) -> None:
    props = schema.get("properties", {})
    if "model" in props:
        props["model"] = {"type": "string", "enum": model_names}
    for key in ("max_tokens", "max_completion_tokens"):
        for option in props.get(key, {}).get("anyOf", []):
            if option.get("type") == "integer":
                option["maximum"] = max_tokens
