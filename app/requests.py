"""Parsing and validating OpenAI request bodies.

Only the fields the gateway reads are checked; unknown fields are kept and
forwarded untouched, so clients can use engine-specific options.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.errors import ApiError, bad_request


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: str | list[dict[str, Any]] | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int]


def _translate(exc: ValidationError) -> ApiError:
    err = exc.errors()[0]
    param = ".".join(str(p) for p in err["loc"]) or None
    return bad_request(f"Invalid value for '{param}': {err['msg']}", param, "invalid_value")


def body_too_large(limit_bytes: int) -> ApiError:
    return ApiError(413, f"Request body is larger than {limit_bytes} bytes",
                    "invalid_request_error", None, "body_too_large")


def parse_json(raw: bytes, limit_bytes: int) -> dict[str, Any]:
    if len(raw) > limit_bytes:
        raise body_too_large(limit_bytes)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"Request body is not valid JSON: {exc}", None, "invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("Request body must be a JSON object", None, "invalid_json")
    return data


def validate_chat(body: dict[str, Any]) -> ChatRequest:
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise _translate(exc) from None


def validate_completion(body: dict[str, Any]) -> CompletionRequest:
    try:
        return CompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise _translate(exc) from None


def message_text(content: str | list[dict[str, Any]] | None) -> str:
    """The text of a message; multimodal parts contribute their text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
