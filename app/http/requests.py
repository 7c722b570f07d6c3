"""Parsing and validating OpenAI request bodies.

Only the fields the gateway reads are checked; unknown fields are kept and
forwarded untouched, so clients can use engine-specific options. Hostile
bodies are refused with a 400 before anything else reads them: JSON nested
deeper than MAX_JSON_DEPTH, content parts of a kind no worker takes,
token limits beyond any context.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.errors import ApiError, bad_request, body_too_large
from app.jsonio import loads_exact
from router.thinking import EFFORT_CEILING

MAX_JSON_DEPTH = 32  # OpenAI bodies nest ~6 deep (tools' JSON schemas more)
MAX_TOKENS_LIMIT = 2**31 - 1  # what workers' 32-bit token counts hold
MAX_RATE = 2**53  # requests or tokens per minute: beyond any use, within every column type
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|(list|dict)\[.*\]|[A-Z]\w*)$")
TEXT_PART = "text"


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: str | list[ContentPart] | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["text", "image_url", "input_audio", "file", "refusal"]
    text: str | None = None


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema
    strict: bool | None = None


class Tool(BaseModel):
    """A tool the model may call: a function, the one kind llama.cpp and vLLM
    take (a malformed one was the worker's 500, answered as a 502)."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["function"]
    function: FunctionSpec


I32 = 2**31 - 1


class _LlamaCpp(BaseModel):
    """llama.cpp's own fields, checked where a wrong type or range is a
    worker's 500 (or a request it spends long on): refused here with a 400
    naming the field, forwarded as sent otherwise. vLLM ignores them."""

    model_config = ConfigDict(extra="allow", strict=True)
    top_k: int | None = Field(default=None, ge=0, le=I32)
    min_p: float | None = Field(default=None, ge=0, le=1)
    typical_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, ge=0, le=1e6)
    repeat_last_n: int | None = Field(default=None, ge=-1, le=I32)
    mirostat: int | None = Field(default=None, ge=0, le=2)  # off, v1, v2
    mirostat_tau: float | None = Field(default=None, ge=0, le=1e6)
    mirostat_eta: float | None = Field(default=None, ge=0, le=1e6)
    dry_multiplier: float | None = Field(default=None, ge=0, le=1e6)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)
    n_probs: int | None = Field(default=None, ge=0, le=1024)
    n_keep: int | None = Field(default=None, ge=-1, le=I32)
    id_slot: int | None = Field(default=None, ge=-1, le=I32)
    t_max_predict_ms: int | None = Field(default=None, ge=0, le=I32)
    n_indent: int | None = Field(default=None, ge=0, le=I32)
    cache_prompt: bool | None = None
    return_tokens: bool | None = None
    timings_per_token: bool | None = None
    samplers: list[str] | str | None = None
    stop: str | list[str] | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    # where the thinking goes (an unknown one is a llama.cpp 500)
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = None

    @field_validator("json_schema")
    @classmethod
    def _one_constraint(cls, v: dict[str, Any] | None, info: Any) -> dict[str, Any] | None:
        if v is not None and info.data.get("grammar") is not None:
            raise ValueError("give `grammar` or `json_schema`, not both (llama.cpp takes one)")
        return v

    # Declared after the constraints, so its check sees them.
    response_format: Any = None
    ignore_eos: bool | None = None

    @field_validator("ignore_eos")
    @classmethod
    def _constraint_can_end(cls, v: bool | None, info: Any) -> bool | None:
        # A JSON schema always completes, and then only the end token may
        # follow: with ignore_eos llama.cpp fails the request ("empty grammar
        # stack"). A free `grammar` may never complete (a repeating one is a
        # fair test load), so it is let through; if it completes, the
        # worker's failure is answered as the client's (app/forward/proxy.py).
        fmt = info.data.get("response_format")
        json_out = info.data.get("json_schema") is not None or (
            isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"))
        if v and json_out:
            raise ValueError("cannot be true with `json_schema` or a JSON `response_format` "
                             "(the JSON's end ends the answer)")
        return v


class _Common(_LlamaCpp):
    model_config = ConfigDict(extra="allow", strict=True)
    model: str = Field(min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    # One choice per request: the worker is asked for one answer, and one is metered.
    n: int | None = Field(default=None, ge=1, json_schema_extra={"maximum": 1})
    # llama.cpp's own length field (it wins over max_tokens there): one cap with
    # the others (app/forward/rewrite.py sends the smallest as max_tokens).
    n_predict: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    n_cmpl: int | None = Field(default=None, ge=1,  # llama.cpp: completions per prompt
                               json_schema_extra={"maximum": 1})
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)

    @field_validator("n", "n_cmpl")
    @classmethod
    def _one_choice(cls, v: int | None) -> int | None:
        if v is not None and v > 1:
            raise ValueError("one choice per request: send it as that many requests "
                             "(each is routed and metered on its own)")
        return v

    @property
    def token_limit(self) -> int | None:
        """The smallest of the length fields the client sent (None: none)."""
        asked = [n for n in (self.max_tokens, getattr(self, "max_completion_tokens", None),
                             self.n_predict) if n is not None]
        return min(asked) if asked else None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    # How much a reasoning model may think (OpenAI's field; "none": not at all),
    # and the engines' own numeric budgets, honoured as ceilings.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    thinking_budget_tokens: int | None = Field(default=None, ge=-1, le=MAX_TOKENS_LIMIT)
    reasoning_budget_tokens: int | None = Field(default=None, ge=-1, le=MAX_TOKENS_LIMIT)
    thinking_token_budget: int | None = Field(default=None, ge=-1, le=MAX_TOKENS_LIMIT)
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None

    @property
    def effort_ceiling(self) -> int | None:
        """The largest thinking budget the client's reasoning_effort (or
        `enable_thinking: false`) allows; 0: no thinking; None: no limit. The
        router reads it."""
        limits = []
        if self.reasoning_effort is not None:
            limits.append(EFFORT_CEILING[self.reasoning_effort])
        if (self.chat_template_kwargs or {}).get("enable_thinking") is False:
            limits.append(0)
        return min(limits) if limits else None

    @property
    def thinking_ceiling(self) -> int | None:
        """`effort_ceiling` and the engines' own numeric budgets the client sent
        (-1: the engine's default, no limit): what forwarding enforces. The
        router does not price a numeric budget (docs/routing.md)."""
        limits = [n for n in (self.thinking_budget_tokens, self.reasoning_budget_tokens,
                              self.thinking_token_budget, self.effort_ceiling)
                  if n is not None and n >= 0]
        return min(limits) if limits else None

    @property
    def limit_includes_thinking(self) -> bool:
        """The binding length limit is max_completion_tokens (OpenAI: reasoning
        tokens included), not max_tokens (the answer's allowance)."""
        return self.max_completion_tokens is not None \
            and self.max_completion_tokens == self.token_limit


class CompletionRequest(_Common):
    # One prompt per request (a string, or token ids): several prompts in one
    # request would be answered, and billed, as one.
    prompt: str | list[int] | list[str] = Field(union_mode="left_to_right")

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[int] | list[str]) -> str | list[int] | list[str]:
        if isinstance(v, list) and v and isinstance(v[0], str) and len(v) > 1:
            raise ValueError("one prompt per request (send each prompt as its own request)")
        return v


Message.model_rebuild()
ChatRequest.model_rebuild()


def _field_path(loc: tuple[int | str, ...]) -> list[str]:
    """A location without pydantic's union-member tags (`str`, `list[ContentPart]`)."""
    return [str(p) for p in loc if isinstance(p, int) or not _UNION_TAG.match(p)]


def _translate(exc: ValidationError) -> ApiError:
    # Of a union's errors, the one that went deepest names the real problem.
    err = max(exc.errors(), key=lambda e: len(_field_path(e["loc"])))
    param = ".".join(_field_path(err["loc"])) or None
    if err["type"] == "missing":  # OpenAI's wording and code
        return bad_request(f"Missing required parameter: '{param}'", param,
                           "missing_required_parameter")
    return bad_request(f"Invalid value for '{param}': {err['msg']}", param, "invalid_value")


def is_json_type(content_type: str | None) -> bool:
    """application/json (any parameters). Anything else is refused: a web page can
    send text/plain or a form to a local gateway without a CORS preflight."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


def too_deep() -> ApiError:
    return bad_request(f"Request body nests deeper than {MAX_JSON_DEPTH} levels", None,
                       "json_too_deep")


def parse_json(raw: bytes, limit_bytes: int) -> dict[str, Any]:
    if len(raw) > limit_bytes:
        raise body_too_large(limit_bytes)
    try:
        data = loads_exact(raw)  # the standard library's meaning, big integers included
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"Request body is not valid JSON: {exc}", None, "invalid_json") from None
    except RecursionError:
        raise too_deep() from None
    except ValueError as exc:  # an integer of more digits than Python converts (4,300)
        raise bad_request(f"Request body holds a number too long to read: {exc}", None,
                          "invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("Request body must be a JSON object", None, "invalid_json")
    if _SURROGATE_ESCAPE.search(raw) and (where := _lone_surrogate(data)) is not None:
        # Valid JSON, but no worker takes text that is not Unicode (it answered 500).
        raise bad_request(f"'{where}' holds a lone surrogate (\\ud800-\\udfff): not valid "
                          "Unicode text", where, "invalid_value")
    # Nesting deeper than the limit needs more opening brackets than it: most
    # bodies have fewer (counted in C, strings' brackets too), and skip the walk.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _deeper_than(data, MAX_JSON_DEPTH):
        raise too_deep()
    return data


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(obj: dict[str, Any]) -> str | None:
    """The path of a string (key or value) that cannot be UTF-8 (a lone
    surrogate), or None."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        node, path = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            here = f"{path}.{key}" if path else str(key)
            for text in (key, value):
                if isinstance(text, str):
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError:
                        return here
            if isinstance(value, dict | list):
                stack.append((value, here))
    return None


def _deeper_than(obj: dict[str, Any], limit: int) -> bool:
    """Whether containers nest deeper than `limit` (iterative: no recursion)."""
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def part_kinds(messages: list[Message]) -> set[str]:
    """The kinds of non-text content parts in a conversation; 400 for text parts
    without text."""
    kinds: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m.content, list):
            continue
        for j, part in enumerate(m.content):
            where = f"messages.{i}.content.{j}"
            if part.type == TEXT_PART:
                if part.text is None:
                    raise bad_request(f"Invalid value for '{where}.text': a text part needs "
                                      "text", f"{where}.text", "invalid_value")
            else:
                kinds.add(part.type)
    return kinds


def validate_chat(body: dict[str, Any]) -> ChatRequest:
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise _translate(exc) from None


class NewKey(BaseModel):
    """POST /v1/admin/keys."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    rpm: int | None = Field(default=None, gt=0, le=MAX_RATE)
    tpm: int | None = Field(default=None, gt=0, le=MAX_RATE)
    joule_budget: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    budget_period: Literal["day", "week", "month"] = "month"
    # Stored comma-separated: a name with a comma would read back as two.
    models: list[Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^,]+$")]] \
        | None = None


def validate_new_key(body: dict[str, Any]) -> NewKey:
    try:
        return NewKey.model_validate(body)
    except ValidationError as exc:
        raise _translate(exc) from None


def validate_completion(body: dict[str, Any]) -> CompletionRequest:
    try:
        return CompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise _translate(exc) from None


def message_text(content: str | list[ContentPart] | None) -> str:
    """The text of a message; multimodal parts contribute their text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return " ".join(p.text for p in content if p.text is not None)
