"""Assembling one response from stream chunks: text, reasoning, tool calls, logprobs."""

from __future__ import annotations

from app.forward.assemble import Assembler

BASE = {"id": "c1", "created": 7, "model": "m", "object": "chat.completion.chunk"}


def chunk(**choice: object) -> dict[str, object]:
    return {**BASE, "choices": [{"index": 0, "finish_reason": None, **choice}]}


def test_chat_content_and_reasoning_are_joined() -> None:
    a = Assembler(chat=True)
    a.add(chunk(delta={"role": "assistant", "content": None}))
    a.add(chunk(delta={"reasoning_content": "think "}))
    a.add(chunk(delta={"reasoning_content": "more"}))
    a.add(chunk(delta={"content": "Hel"}))
    a.add(chunk(delta={"content": "lo"}))
    a.add({**chunk(delta={}, finish_reason="stop"), "timings": {"predicted_n": 2}})
    out = a.result({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    assert out["object"] == "chat.completion" and out["id"] == "c1"
    msg = out["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "Hello", "reasoning_content": "think more"}
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["timings"] == {"predicted_n": 2} and out["usage"]["total_tokens"] == 5


def test_tool_calls_are_merged_by_index() -> None:
    a = Assembler(chat=True)
    a.add(chunk(delta={"tool_calls": [{"index": 0, "id": "t0", "type": "function",
                                       "function": {"name": "get_", "arguments": "{\"ci"}}]}))
    a.add(chunk(delta={"tool_calls": [{"index": 0, "function": {"name": "weather",
                                                                "arguments": "ty\": 1}"}}]}))
    a.add(chunk(delta={"tool_calls": [{"index": 1, "id": "t1",
                                       "function": {"name": "now", "arguments": "{}"}}]}))
    a.add(chunk(delta={}, finish_reason="tool_calls"))
    calls = a.result(None)["choices"][0]["message"]["tool_calls"]
    assert calls == [
        {"id": "t0", "type": "function", "function": {"name": "get_weather",
                                                      "arguments": "{\"city\": 1}"}},
        {"id": "t1", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]


def test_text_completion_and_logprobs() -> None:
    a = Assembler(chat=False)
    base = {**BASE, "object": "text_completion"}
    a.add({**base, "choices": [{"index": 0, "text": "a", "finish_reason": None,
                                "logprobs": {"content": [{"token": "a", "logprob": -1}]}}]})
    a.add({**base, "choices": [{"index": 0, "text": "b", "finish_reason": "length",
                                "logprobs": {"content": [{"token": "b", "logprob": -2}]}}]})
    out = a.result(None)
    assert out["object"] == "text_completion"
    assert out["choices"][0]["text"] == "ab" and out["choices"][0]["finish_reason"] == "length"
    assert [x["token"] for x in out["choices"][0]["logprobs"]["content"]] == ["a", "b"]
