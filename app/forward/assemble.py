"""Assembling a whole OpenAI response from the chunks of a stream.

The gateway asks workers to stream even when the client did not: then a
client that gives up, a worker timeout or the loop guard stops generation at
once (llama-server keeps generating a non-streamed answer after its client
has gone, measured), and every request has an exact token timeline for
energy attribution. The client still gets one ordinary JSON response.
"""

from __future__ import annotations

from typing import Any

_SKIP = {"choices", "object", "usage"}


class Assembler:
    """Folds `chat.completion.chunk` or `text_completion` chunks into one response."""

    def __init__(self, chat: bool) -> None:
        self._chat = chat
        self._top: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for key, value in chunk.items():
            if key not in _SKIP and value is not None:
                self._top[key] = value  # id, created, model, fingerprint, timings...
        for c in chunk.get("choices") or []:
            if isinstance(c, dict):
                self._add_choice(c)

    def _add_choice(self, c: dict[str, Any]) -> None:
        index = int(c.get("index", 0))
        choice = self._choices.setdefault(index, {"index": index, "finish_reason": None,
                                                  "parts": {}, "tools": {}, "logprobs": []})
        if c.get("finish_reason") is not None:
            choice["finish_reason"] = c["finish_reason"]
        lp = c.get("logprobs")
        if isinstance(lp, dict):
            choice["logprobs"] += lp.get("content") or []
        delta = c.get("delta") if self._chat else {"content": c.get("text")}
        if not isinstance(delta, dict):
            return
        for key in ("role", "content", "reasoning_content", "refusal"):
            if isinstance(delta.get(key), str):
                joined = "" if key == "role" else choice["parts"].get(key, "")
                choice["parts"][key] = joined + delta[key]
        for call in delta.get("tool_calls") or []:
            self._add_tool_call(choice["tools"], call)

    @staticmethod
    def _add_tool_call(tools: dict[int, dict[str, Any]], call: dict[str, Any]) -> None:
        slot = tools.setdefault(int(call.get("index", len(tools))),
                                {"id": None, "type": "function",
                                 "function": {"name": "", "arguments": ""}})
        if call.get("id"):
            slot["id"] = call["id"]
        if call.get("type"):
            slot["type"] = call["type"]
        fn = call.get("function") or {}
        slot["function"]["name"] += fn.get("name") or ""
        slot["function"]["arguments"] += fn.get("arguments") or ""

    def result(self, usage: dict[str, Any] | None) -> dict[str, Any]:
        choices = []
        for index in sorted(self._choices):
            c = self._choices[index]
            out: dict[str, Any] = {"index": index, "finish_reason": c["finish_reason"]}
            parts = c["parts"]
            if self._chat:
                message: dict[str, Any] = {"role": parts.get("role", "assistant"),
                                           "content": parts.get("content")}
                for key in ("reasoning_content", "refusal"):
                    if key in parts:
                        message[key] = parts[key]
                if c["tools"]:
                    message["tool_calls"] = [c["tools"][i] for i in sorted(c["tools"])]
                out["message"] = message
            else:
                out["text"] = parts.get("content", "")
            out["logprobs"] = {"content": c["logprobs"]} if c["logprobs"] else None
            choices.append(out)
        body = {**self._top, "object": "chat.completion" if self._chat else "text_completion",
                "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body
