"""Thinking budgets for reasoning models: cap the think span, close it, answer.

- No thinking: `chat_template_kwargs: {"enable_thinking": false}` (the
  template renders a closed, empty span; app/forward/rewrite.py).
- llama.cpp (this vendored version) does it natively per request:
  `thinking_budget_tokens: N` makes the sampler write `reasoning_budget_message`
  and force the template's end tag after N thinking tokens (after a UTF-8
  character completes), then go on to the answer.
- vLLM with a reasoning config (`--reasoning-config`): `thinking_token_budget`.
- Any vLLM (`thinking: splice`): two requests. The first thinks with
  `max_tokens = N` and the end tag as a stop string; if the span did not
  close, `close_span` closes it (with the budget message) and
  `continuation_body` asks for the answer with `continue_final_message`
  (the assistant message so far is continued, not restarted).
"""

from __future__ import annotations

from typing import Any

START_TAG = "<think>"
END_TAG = "</think>"


def llamacpp_fields(budget: int, message: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"thinking_budget_tokens": budget}
    if message:
        out["reasoning_budget_message"] = message
    return out


def vllm_fields(budget: int) -> dict[str, Any]:
    return {"thinking_token_budget": budget}


def vllm_think_body(body: dict[str, Any], budget: int, end_tag: str = END_TAG
                    ) -> dict[str, Any]:
    """The first request: think for at most `budget` tokens."""
    out = dict(body)  # shallow: fields are replaced, never changed in place
    out.update(max_tokens=budget, stop=[end_tag], stream=False)
    out.pop("stream_options", None)
    return out


def close_span(thinking: str, start_tag: str = START_TAG, end_tag: str = END_TAG) -> str:
    """An assistant prefix whose think span is closed.

    `thinking` is what the model produced so far (with or without the start
    tag). Anything after an end tag is dropped; a cut-off span is closed.
    """
    text = thinking
    if end_tag in text:
        text = text[: text.index(end_tag)]
    if start_tag not in text:
        text = start_tag + "\n" + text.lstrip("\n")
    return text.rstrip() + "\n" + end_tag + "\n\n"


def continuation_body(body: dict[str, Any], prefix: str, max_tokens: int | None
                      ) -> dict[str, Any]:
    """The second request: continue the assistant message after the closed span."""
    out = dict(body)  # shallow: fields are replaced, never changed in place
    out["messages"] = [*out.get("messages", []), {"role": "assistant", "content": prefix}]
    out["continue_final_message"] = True
    out["add_generation_prompt"] = False
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    return out
