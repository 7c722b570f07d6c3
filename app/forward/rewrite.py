"""Rewriting a chat body for a decision: model name, token caps, strategy
(an instruction for `cot`, worked examples for `fewshot`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.catalog import Backend
from app.forward.thinking import llamacpp_fields, vllm_fields
from router.decision import Decision
from router.fewshot import with_examples
from router.thinking import CLOSING_TOKENS

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


# The engines' own thinking-budget fields: a client's is a ceiling already in
# the decision (Planner.plan); only the gateway's reaches a worker.
BUDGET_FIELDS = ("thinking_budget_tokens", "reasoning_budget_tokens", "thinking_token_budget")


def rewrite_chat(
    body: dict[str, Any], d: Decision, backend: Backend,
    default_max_tokens: int | None = None, asked: int | None = None,
    limit_includes_thinking: bool = False, budget_message: str | None = None,
    examples: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A copy of `body` for the worker; unknown fields are kept as they are.
    The copy is shallow: what it changes is replaced, never changed in place
    (a long conversation is not copied message by message). `asked`: the
    client's token limit (ChatRequest.token_limit)."""
    out = dict(body)
    out["model"] = backend.model
    if backend.reasoning and d.thinking_budget is not None:
        return _bounded_thinking(out, d, backend, default_max_tokens, asked,
                                 limit_includes_thinking, budget_message)
    capped(out, asked, default_cap(d, default_max_tokens, False))
    if not d.routed or backend.reasoning:
        return out  # a reasoning model asked by name thinks as its engine does
    # Non-reasoning models: the strategy is expressed by prompting.
    if d.strategy == "cot":
        out["messages"] = [{"role": "system", "content": COT_INSTRUCTION},
                           *out.get("messages", [])]
    elif d.strategy == "fewshot":  # `examples`: the decision's category's
        out["messages"] = with_examples(out.get("messages", []), examples)
    return out


def _bounded_thinking(out: dict[str, Any], d: Decision, backend: Backend,
                      default_max_tokens: int | None, asked: int | None,
                      includes: bool, message: str | None) -> dict[str, Any]:
    """A reasoning backend's body under the decision's thinking budget: none
    (the template's `enable_thinking: false`, which llama.cpp and vLLM both
    read), or the engine's own budget (`native`; a `splice` backend gets it
    in two requests, app/forward/splice.py). Unless the client's limit holds
    thinking too (max_completion_tokens), the answer's allowance comes on top
    of the budget."""
    budget = d.thinking_budget or 0
    for f in BUDGET_FIELDS:
        out.pop(f, None)
    kwargs = out.get("chat_template_kwargs")
    kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
    if budget == 0:
        out["chat_template_kwargs"] = {**kwargs, "enable_thinking": False}
        capped(out, asked, default_cap(d, default_max_tokens, False))
        return out
    if kwargs.get("enable_thinking") is False:
        out["chat_template_kwargs"] = {**kwargs, "enable_thinking": True}
    if includes and asked:
        total = asked
    else:
        answer = asked or default_max_tokens or 0
        if d.routed and not asked:  # the router's allowance, within the default
            routed = d.max_tokens - budget - CLOSING_TOKENS
            answer = min(routed, answer) if answer and routed > 0 else max(routed, answer)
        total = budget + CLOSING_TOKENS + answer
    capped(out, None, total)
    if backend.thinking_mode == "native":
        out.update(llamacpp_fields(budget, message) if backend.kind == "llamacpp"
                   else vllm_fields(budget))
    return out
