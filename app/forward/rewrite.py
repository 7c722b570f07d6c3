"""Rewriting a chat body for a decision: model name, token caps, strategy."""

from __future__ import annotations

from typing import Any

from app.forward.thinking import llamacpp_fields
from router.decision import Decision

COT_INSTRUCTION = (
    "Think step by step, briefly, then give the final answer on its own line "
    "starting with 'Answer:'."
)
DIRECT_INSTRUCTION = "Answer directly and concisely, without showing your reasoning."


def default_cap(d: Decision, default_max_tokens: int | None, thinks: bool) -> int | None:
    """max_tokens for a request that named none: the decision's cap for `auto`
    (no more than the models file's `defaults.max_tokens` unless the model
    thinks, whose budget the decision's cap already holds), the default for a
    model asked for by name."""
    if not d.routed:
        return default_max_tokens
    if default_max_tokens is None or thinks:
        return d.max_tokens
    return min(d.max_tokens, default_max_tokens)


LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict")


def capped(out: dict[str, Any], asked: int | None, cap: int | None) -> None:
    """`out` with one length field, max_tokens: `asked` (the smallest the
    client sent: the validated request's token_limit), else `cap`. llama.cpp's
    n_predict wins over max_tokens there, so no length field but ours reaches
    a worker."""
    for f in LENGTH_FIELDS:
        out.pop(f, None)
    limit = asked or cap
    if limit:
        out["max_tokens"] = limit


def rewrite_chat(
    body: dict[str, Any], d: Decision, upstream_model: str, reasoning: bool,
    thinking_mode: str = "native", default_max_tokens: int | None = None,
    asked: int | None = None,
) -> dict[str, Any]:
    """A copy of `body` for the worker; unknown fields are kept as they are.
    The copy is shallow: what it changes is replaced, never changed in place
    (a long conversation is not copied message by message). `asked`: the
    client's token limit (ChatRequest.token_limit)."""
    out = dict(body)
    out["model"] = upstream_model
    capped(out, asked, default_cap(d, default_max_tokens,
                                  reasoning and d.thinking_budget is not None))
    if not d.routed:
        return out
    if reasoning:
        # Reasoning models think natively; the budget caps the think span.
        if thinking_mode == "native" and d.thinking_budget is not None:
            out.update(llamacpp_fields(d.thinking_budget))
        return out
    # Non-reasoning models: the strategy is expressed by prompting.
    instruction = COT_INSTRUCTION if d.strategy == "cot" else None
    if instruction is not None:
        messages = out.get("messages", [])
        out["messages"] = [{"role": "system", "content": instruction}, *messages]
    return out
