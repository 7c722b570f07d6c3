"""Token counts and energy in responses: reading usage, adding energy, and
merging a spliced request's thinking phase into its answer.

Pure functions over response dicts; the proxy calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from telemetry.timeline import EnergyFigure, TokenTimeline


@dataclass(frozen=True)
class Prior:
    """What a spliced request's thinking phase cost and produced."""

    prompt_tokens: int
    completion_tokens: int
    figure: EnergyFigure | None
    thinking: str
    worker_s: float = 0.0  # from its worker call to its answer read: not the gateway's time


def chunk_text(chunk: dict[str, Any]) -> str:
    """The generated text in a stream chunk (one token per chunk on llama.cpp);
    ValueError for a chunk whose choices are not a list (a broken worker)."""
    choices = chunk.get("choices") or []
    if not isinstance(choices, list):
        raise ValueError(f"malformed event: choices is {type(choices).__name__}, not a list")
    out = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        parts = [choice.get("text")]
        if isinstance(delta, dict):
            parts += [delta.get("content"), delta.get("reasoning_content")]
        out += [p for p in parts if isinstance(p, str) and p]
    return "".join(out)


def chunk_thinks(chunk: dict[str, Any]) -> bool:
    """Whether a stream chunk's token is thinking (`reasoning_content`)."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and delta.get("reasoning_content"):
            return True
    return False


class InlineThinking:
    """Think spans a reasoning model's engine left in `content` (a vLLM
    without a reasoning parser, llama.cpp's `reasoning_format: none`, a span
    opened again mid-answer) moved to `reasoning_content`, and an end tag the
    engine's parser let through dropped: no `<think>` or `</think>` reaches the
    answer. Tags are whole in a chunk (one token on llama.cpp and vLLM)."""

    def __init__(self, start: str = "<think>", end: str = "</think>") -> None:
        self.start, self.end = start, end
        self.inside = False
        self.trim = False  # the blank lines after a span

    def feed(self, chunk: dict[str, Any]) -> bool:
        """Move the chunk's thinking out of `content`; whether it changed."""
        changed = False
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            text = delta.get("content")
            if not isinstance(text, str) or not text:
                continue
            if not self.inside and not self.trim and self.start not in text \
                    and self.end not in text:
                continue  # the common case: answer text
            said, thought = self._split(text)
            if said == text and not thought:
                continue
            delta["content"] = said
            if thought:
                delta["reasoning_content"] = (delta.get("reasoning_content") or "") + thought
            changed = True
        return changed

    def _split(self, text: str) -> tuple[str, str]:
        said: list[str] = []
        thought: list[str] = []
        while text:
            if self.inside:
                part, tag, text = text.partition(self.end)
                thought.append(part)
                if tag:
                    self.inside, self.trim = False, True
                continue
            if self.trim:
                text = text.lstrip("\n")
                self.trim = not text
                continue
            part, tag, text = text.partition(self.start)
            closed, stray, after = part.partition(self.end)  # a tag the parser let through
            said.append(closed + after.lstrip("\n") if stray else part)
            if stray and not after.strip("\n"):
                self.trim = True
            if tag:
                self.inside = True
        return "".join(said), "".join(thought)


def with_thinking(usage: dict[str, Any], tokens: int) -> dict[str, Any]:
    """`usage` saying how many of its completion tokens were thinking: OpenAI's
    completion_tokens_details.reasoning_tokens, and joulegate's thinking_tokens."""
    details = usage.get("completion_tokens_details")
    details = dict(details) if isinstance(details, dict) else {}
    details["reasoning_tokens"] = tokens
    return {**usage, "completion_tokens_details": details, "thinking_tokens": tokens}


def loop_chunk(last: dict[str, Any] | None) -> dict[str, Any]:
    """A final chunk saying the gateway stopped a looping generation."""
    base: dict[str, Any] = {k: last[k] for k in ("id", "created", "model", "object")
                            if last is not None and k in last}
    choice: dict[str, Any] = {"index": 0, "finish_reason": "loop_detected"}
    if base.get("object") == "text_completion":
        choice["text"] = ""
    else:
        choice["delta"] = {}
    return {**base, "choices": [choice]}


def cached_tokens(usage: object) -> int | None:
    """The prompt tokens a worker says it had cached, where it says."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and cached >= 0 else None


def usage_tokens(usage: object, prompt_default: int, completion_default: int) -> tuple[int, int]:
    """(prompt tokens computed, completion tokens); cached prompt tokens cost no prefill."""
    if not isinstance(usage, dict):
        return prompt_default, completion_default
    p = usage.get("prompt_tokens")
    c = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = p if isinstance(p, int) else prompt_default
    if isinstance(cached, int):
        prompt = max(0, prompt - cached)
    return prompt, c if isinstance(c, int) else completion_default


def mark_whole(timeline: TokenTimeline, body: object, prompt: int, completion: int) -> None:
    """Progress of a request answered whole (only a spliced thinking phase now;
    everything else streams from the worker): prefill first, then decode.

    llama.cpp reports `timings.predicted_ms`; where it does, decode is placed in
    the last `predicted_ms` of the request, else prefill is placed at the start.
    """
    end = timeline.elapsed_s()
    timings = body.get("timings") if isinstance(body, dict) else None
    decode_s = None
    if isinstance(timings, dict) and isinstance(timings.get("predicted_ms"), int | float):
        decode_s = min(end, float(timings["predicted_ms"]) / 1000.0)
    first = end - decode_s if decode_s is not None else 0.0
    timeline.mark(prompt, 0, offset_s=first)
    timeline.mark(prompt, completion, offset_s=end)


def plus_prior(figure: EnergyFigure | None, prior: Prior | None) -> EnergyFigure | None:
    """A spliced request's energy: its thinking phase plus its answer."""
    if prior is None or prior.figure is None or figure is None:
        return figure
    p = prior.figure
    standalone = None if figure.standalone_j is None or p.standalone_j is None \
        else figure.standalone_j + p.standalone_j
    return EnergyFigure(figure.net_j + p.net_j, figure.gross_j + p.gross_j, figure.source,
                        figure.final and p.final, figure.prefill_j + p.prefill_j,
                        figure.decode_j + p.decode_j, standalone)


def add_prior_usage(usage: dict[str, Any], prior: Prior | None) -> None:
    if prior is None:
        return
    for key, extra in (("prompt_tokens", prior.prompt_tokens),
                       ("completion_tokens", prior.completion_tokens)):
        if isinstance(usage.get(key), int):
            usage[key] += extra
    if isinstance(usage.get("total_tokens"), int):
        usage["total_tokens"] += prior.prompt_tokens + prior.completion_tokens
    usage.update(with_thinking(usage, prior.completion_tokens))


def message_thinking(body: dict[str, Any]) -> str:
    """The thinking a first-phase response holds (vLLM's reasoning parser puts it in
    `reasoning_content`; without one it is the content)."""
    choices = body.get("choices") or [{}]
    message = choices[0].get("message") or {} if isinstance(choices[0], dict) else {}
    text = message.get("reasoning_content") or message.get("content") or ""
    return str(text)


def merge_thinking(body: dict[str, Any], prior: Prior) -> None:
    for choice in body.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and not message.get("reasoning_content"):
            message["reasoning_content"] = prior.thinking


# What a source's figure covers: one GPU (NVML), or the whole machine (RAPL's
# CPU package, the utilisation estimate): on a shared machine the latter
# include a neighbour's load the ledger could not tell apart.
SCOPES = {"nvml": "device", "rapl": "machine", "estimate": "machine"}


def energy_fields(figure: EnergyFigure | None) -> dict[str, Any]:
    if figure is None:
        return {"energy_joules": None, "energy_source": "unavailable"}
    fields = {
        "energy_joules": round(figure.net_j, 4),
        "energy_gross_joules": round(figure.gross_j, 4),
        "energy_source": figure.source,
        "energy_scope": SCOPES.get(figure.source, "device"),
        "energy_final": figure.final,
    }
    if figure.standalone_j is not None:
        # What this request would have cost alone (gross), from the curve.
        fields["energy_standalone_joules"] = round(figure.standalone_j, 4)
        fields["energy_standalone_source"] = "estimate"
    return fields
