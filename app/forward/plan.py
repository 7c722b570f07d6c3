"""A request's plan, as data: what the client asked (`Ask`, `Needs`) and what
to send where (`Forward`). Made by `Planner`, carried out by `Proxy`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from app.catalog import Backend
from app.errors import ApiError, bad_request
from app.forward.usage import Prior
from app.tenancy.admission import Hold
from app.tenancy.keys import ApiKey
from router.decision import Decision, Query
from router.record import record

BodyFor = Callable[[Decision, Backend], dict[str, Any]]


@record
class Needs:
    """What a request needs of a backend."""

    vision: bool = False
    tokens: int | None = None  # max_tokens asked for

    def unmet_by(self, b: Backend) -> ApiError | None:
        """The 400 for sending this request to `b`, or None when `b` can take it."""
        if self.vision and not b.vision:
            return bad_request(f"model '{b.name}' does not accept image input", "messages")
        if self.tokens is not None and self.tokens > b.context_limit:
            return bad_request(f"max_tokens ({self.tokens}) exceeds the context of model "
                               f"'{b.name}' ({b.context_limit} tokens)", "max_tokens")
        return None

    def fitting(self, backends: list[Backend]) -> list[Backend]:
        """The backends that can take the request; the last one's 400 when none can."""
        fits = [b for b in backends if self.unmet_by(b) is None]
        if not fits:
            refusal = self.unmet_by(backends[-1])
            assert refusal is not None
            raise refusal
        return fits


@record
class Ask:
    """A validated request, as the HTTP layer read it."""

    model: str
    query: Query
    needs: Needs
    path: str
    body_for: BodyFor  # the worker's body for a decision and backend
    stream: bool
    wants_usage: bool
    received_at: float  # time.perf_counter() when the request arrived
    key: ApiKey | None = None
    disconnected: Callable[[], Awaitable[bool]] | None = None
    # The largest thinking budget the client allows, its numeric budget
    # fields included (ChatRequest.thinking_ceiling); None: no limit.
    thinking_ceiling: int | None = None


@record
class Forward:
    """What to send where, and what the client asked for."""

    path: str
    body: dict[str, Any]
    decision: Decision
    route: str  # "auto" or "forced"
    stream: bool
    client_wants_usage: bool
    prompt_tokens_estimate: int
    received_at: float  # time.perf_counter() when the request arrived
    model_name: str = ""  # the name responses carry (the configured model)
    prior: Prior | None = None  # a first (thinking) request already made for this one
    disconnected: Callable[[], Awaitable[bool]] | None = None  # the client went away?
    # For `auto` and tiers: what the client asked, to plan again without the
    # backends that could not take it (Planner.replan); None for a named backend.
    ask: Ask | None = None
    key: ApiKey | None = None  # the API key that sent it (None: open gateway)
    budget_used: float | None = None  # the key's share of its joule budget, when steered
    reasoning: bool = False  # a reasoning model's answer: think tags never reach content
    hold: Hold | None = None  # the joules reserved against the key's budget
    asked: str = ""  # the model name the client asked for
