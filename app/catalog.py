"""The catalog: devices, backends and tiers, loaded from models.yaml.

A bad file stops start-up with a message that names the bad field, e.g.
`models.yaml: backends.0.replicas.0.url: Input should be a valid URL`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from router.policy import FULL_TOLERANCE_FROM
from router.pricing import BATCHING, COLOCATION_PENALTY, SHARE_AT_MOST_IN_FLIGHT, Batching

BackendKind = Literal["llamacpp", "vllm"]
SourceName = Literal["auto", "nvml", "rapl", "estimate"]


DEFAULT_CONTEXT_TOKENS = 4096  # a backend whose worker did not say


class CatalogError(Exception):
    """models.yaml is missing, unreadable or invalid."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Device(_Strict):
    """A GPU or CPU package whose energy is metered."""

    name: str
    host: str = "localhost"
    source: SourceName = "auto"
    index: int = Field(default=0, ge=0, description="NVML device index or RAPL package")
    idle_power_w: float | None = Field(default=None, ge=0)
    max_power_w: float = Field(default=65.0, gt=0, description="estimate: power at full load")
    estimate_idle_power_w: float = Field(default=10.0, ge=0)
    # A prefill token's share of work relative to a decode token, for attribution
    # (bench/gpu_telemetry.py fits it: 0.009 on an H200 with llama.cpp).
    prefill_weight: float = Field(default=0.1, ge=0)
    # The `joulegate agent` that meters this device (the one on its machine);
    # unset: JOULEGATE_AGENT_URL, or this process meters it.
    agent: HttpUrl | None = None
    # Whether the deployment powers this device down when it runs nothing:
    # then waking it costs its idle power for `wake_s` on top of a request's
    # curve (app/upstream/placement.py); by default its idle power is paid anyway.
    power_down: bool = False
    wake_s: float = Field(default=60.0, ge=0)


class Replica(_Strict):
    url: HttpUrl
    device: str
    # Requests in flight at once on this replica; more wait in the backend's queue.
    max_concurrency: int = Field(default=32, gt=0)

    @functools.cached_property
    def base(self) -> str:
        return str(self.url).rstrip("/")


class Backend(_Strict):
    """One served model, of one engine, with one or more replicas."""

    name: str
    kind: BackendKind
    tier: str
    model: str = Field(description="model name sent upstream")
    replicas: list[Replica] = Field(min_length=1)
    reasoning: bool = False
    # How a reasoning model's think span is capped: `native` (the engine's own
    # per-request budget: llama.cpp's thinking_budget_tokens, vLLM's
    # thinking_token_budget where the server has a reasoning config) or
    # `splice` (two requests with continue_final_message: any vLLM).
    # Default: native on llamacpp, splice on vllm.
    thinking: Literal["native", "splice"] | None = None
    curves: str | None = None
    # The weights' type (F16, Q4_K_M, AWQ...) where the engine does not say it
    # (llama-server does, in /props): compared with what the curve was measured on.
    weights: str | None = None
    # A request's room (prompt and answer), per slot; unset: read from the
    # worker at start-up (llama-server's /props, vLLM's max_model_len).
    context_tokens: int | None = Field(default=None, gt=0)
    vision: bool = False  # accepts image_url content parts
    # Requests waiting for a replica slot; beyond it: 429 with Retry-After.
    max_queue: int = Field(default=256, ge=0)
    # Which replica takes a request: the fewest marginal joules by the curve
    # (packing batches, up to `max_batch` requests per replica: the latency
    # bound), or the least outstanding. Default: by joules where there is a curve.
    placement: Literal["marginal_joules", "least_outstanding"] = "marginal_joules"
    max_batch: int | None = Field(default=None, gt=0)  # unset: the replica's max_concurrency
    # The latency bound in a client's unit: no replica whose measured seconds
    # per answer token, at the batch a request would join, exceed it is packed
    # further (app/upstream/pace.py); unset: `max_batch` alone.
    max_seconds_per_token: float | None = Field(default=None, gt=0)

    @property
    def context_limit(self) -> int:
        """The context a request may fill: configured, learned, or DEFAULT_CONTEXT_TOKENS."""
        return self.context_tokens or DEFAULT_CONTEXT_TOKENS

    @property
    def thinking_mode(self) -> str:
        return self.thinking or ("native" if self.kind == "llamacpp" else "splice")


class Defaults(_Strict):
    model: str = "auto"
    policy: Literal["min-energy", "balanced", "max-quality"] = "balanced"
    max_tokens: int = Field(default=512, gt=0)
    quality_tolerance: float = Field(default=0.05, ge=0, le=1)


class Example(_Strict):
    """One worked example for few-shot prompting: a request and its answer."""

    user: str = Field(min_length=1)
    assistant: str = Field(min_length=1)


class Routing(_Strict):
    tolerance: float = Field(default=0.05, ge=0, le=1)
    direct_max_tokens: int = Field(default=512, gt=0)
    cot_max_tokens: int = Field(default=1024, gt=0)
    # Thinking budgets a reasoning backend's `cot` may take (router.thinking),
    # and the unbounded rung's cap; thinking tokens per category for a model
    # thinking to its own end (seeds: router.thinking.THINKING_TOKENS).
    thinking_budgets: list[PositiveInt] = Field(default=[256, 1024, 4096], min_length=1)
    max_thinking_tokens: int = Field(default=16384, gt=0)
    thinking_tokens: dict[str, float] = Field(default_factory=dict)
    # Written into the think span when a budget runs out, before the engine
    # closes it: the model then answers from what it has (the Qwen3 report's
    # stop-thinking instruction, arXiv 2505.09388, Section 4.7; own words).
    budget_message: str = ("\n\nThe thinking budget is spent, so I will answer now "
                           "from what I have worked out so far.\n")
    strategies: list[Literal["direct", "cot"]] = ["direct", "cot"]
    # Category -> worked examples (or, in a models file, a YAML file of them):
    # the router may put them before a request of that category (router.fewshot).
    few_shot: dict[str, list[Example]] = Field(default_factory=dict)

    @field_validator("few_shot")
    @classmethod
    def _some_examples(cls, v: dict[str, list[Example]]) -> dict[str, list[Example]]:
        empty = [c for c, ex in v.items() if not ex]
        if empty:
            raise ValueError(f"no examples for {', '.join(empty)}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _one_budget(cls, data: Any) -> Any:
        """`thinking_budget: N` (before the ladder): a ladder of one rung."""
        if isinstance(data, dict) and "thinking_budget" in data:
            data = dict(data)
            data.setdefault("thinking_budgets", [data.pop("thinking_budget")])
        return data

    # How load prices an action (router.pricing): a request joining a running
    # batch at its share of the batch (share) or at the margin (its own work);
    # and the co-location penalty beside another model's batch on one device.
    batch_pricing: Batching = BATCHING
    colocation_penalty: float = Field(default=COLOCATION_PENALTY, ge=0, le=10)
    # a request that finds at most this many in flight on its device (per
    # replica) is priced at its share, without the penalty: a pair is not a batch
    share_at_most_in_flight: int = Field(default=SHARE_AT_MOST_IN_FLIGHT, ge=0, le=1024)
    # a quality target's per-query tolerance in full where a request's best
    # action is expected at least this good, in proportion below (0: in full)
    full_tolerance_from: float = Field(default=FULL_TOLERANCE_FROM, ge=0, le=1)
    lengths_file: str | None = None
    # default: the committed router/artifacts/classifier.pkl (read through its
    # arrays, classifier.npz beside it); a .pkl of joulegate train, or its .npz
    classifier: str | None = None
    complexity: str | None = None  # default: the committed router/artifacts/complexity.npz
    # `balanced`: keep this share of always-large quality over traffic like the
    # reference workload (x-joulegate-quality-target overrides it per request).
    quality_target: float = Field(default=0.95, gt=0, le=1)


class Catalog(_Strict):
    tiers: list[str] = Field(min_length=1, description="cheapest first")
    devices: list[Device] = Field(min_length=1)
    backends: list[Backend] = Field(min_length=1)
    defaults: Defaults = Defaults()
    routing: Routing = Routing()
    quality: dict[str, dict[str, float]] = Field(default_factory=dict)
    base_dir: str = "."  # where relative paths resolve (the models.yaml folder)

    @model_validator(mode="after")
    def _references(self) -> Catalog:
        device_names = {d.name for d in self.devices}
        for i, b in enumerate(self.backends):
            if b.tier not in self.tiers:
                raise ValueError(f"backends.{i}.tier: unknown tier '{b.tier}'")
            for j, r in enumerate(b.replicas):
                if r.device not in device_names:
                    raise ValueError(f"backends.{i}.replicas.{j}.device: unknown '{r.device}'")
        for t in self.tiers:
            if not any(b.tier == t for b in self.backends):
                raise ValueError(f"tiers: tier '{t}' has no backend")
        for cat, row in self.quality.items():
            for act, q in row.items():
                tier, _, strategy = act.partition(":")
                if tier not in self.tiers or strategy not in ("direct", "cot"):
                    raise ValueError(f"quality.{cat}.{act}: expected <tier>:<direct|cot>")
                if not 0 <= q <= 1:
                    raise ValueError(f"quality.{cat}.{act}: must be within 0..1")
        names = [b.name for b in self.backends]
        if len(set(names)) != len(names):
            raise ValueError("backends: names must be unique")
        return self

    def backends_of(self, tier: str) -> list[Backend]:
        return self._by_tier.get(tier, [])

    def backend(self, name: str) -> Backend | None:
        return self._by_name.get(name)

    @functools.cached_property
    def _by_name(self) -> dict[str, Backend]:
        return {b.name: b for b in self.backends}

    @functools.cached_property
    def _by_tier(self) -> dict[str, list[Backend]]:
        out: dict[str, list[Backend]] = {}
        for b in self.backends:
            out.setdefault(b.tier, []).append(b)
        return out

    def with_backends(self, backends: list[Backend]) -> Catalog:
        """A copy with these backends (and lookups built anew for them)."""
        copy = self.model_copy(update={"backends": backends})
        for cached in ("_by_name", "_by_tier"):
            copy.__dict__.pop(cached, None)
        return copy

    def device(self, name: str) -> Device:
        return next(d for d in self.devices if d.name == name)

    @property
    def baseline(self) -> str:
        """The name of the baseline energy savings are counted against."""
        return "always-" + self.tiers[-1]

    def path(self, relative: str) -> Path:
        p = Path(relative)
        return p if p.is_absolute() else Path(self.base_dir) / p


def parse_catalog(data: object, origin: str = "models.yaml") -> Catalog:
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        lines = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
            lines.append(f"{origin}: {loc}: {e['msg']}")
        raise CatalogError("\n".join(lines)) from None


def load_catalog(path: Path) -> Catalog:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from None
    if isinstance(data, dict):
        data = {**data, "base_dir": str(path.resolve().parent)}
        if isinstance(data.get("quality"), str):
            # `quality: other.yaml` shares one table among several deployments.
            data["quality"] = _quality_from(path.resolve().parent / data["quality"], path)
        routing = data.get("routing")
        if isinstance(routing, dict) and isinstance(routing.get("few_shot"), dict):
            data["routing"] = {**routing, "few_shot": {
                cat: _examples_from(path.resolve().parent / v, path, cat)
                if isinstance(v, str) else v for cat, v in routing["few_shot"].items()}}
    catalog = parse_catalog(data, str(path))
    _files_exist(catalog, path)
    return catalog


def _files_exist(catalog: Catalog, origin: Path) -> None:
    """Every file the catalog names is there (relative paths are read from
    the models file's folder)."""
    named = [(f"backends.{i}.curves", b.curves) for i, b in enumerate(catalog.backends)]
    named += [("routing.classifier", catalog.routing.classifier),
              ("routing.complexity", catalog.routing.complexity)]
    missing = [f"{origin}: {field}: no file {catalog.path(value)} (a relative path is read "
               f"from the models file's folder, {catalog.base_dir})"
               for field, value in named if value and not catalog.path(value).is_file()]
    missing += [f"{origin}: backends.{i}.curves: {catalog.path(b.curves)}: {why}"
                for i, b in enumerate(catalog.backends)
                if b.curves and catalog.path(b.curves).is_file()
                and (why := _not_a_curve(catalog.path(b.curves)))]
    if missing:
        raise CatalogError("\n".join(missing))


def _not_a_curve(path: Path) -> str | None:
    """Why `path` is not an operating curve `joulegate calibrate` wrote; None
    when it is one."""
    from app.artifacts import load_curve  # it reads catalogs: imported here, not above

    try:
        load_curve(path)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        return f"not an operating curve ({type(exc).__name__}: {detail})"
    return None


def _quality_from(source: Path, origin: Path) -> object:
    try:
        other = yaml.safe_load(source.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"{origin}: quality: cannot read {source}: {exc}") from None
    if not isinstance(other, dict) or not isinstance(other.get("quality"), dict):
        raise CatalogError(f"{origin}: quality: {source} has no `quality:` table")
    return other["quality"]


def _examples_from(source: Path, origin: Path, category: str) -> object:
    """`few_shot: {category: file.yaml}`: the file's list of {user, assistant}."""
    try:
        examples = yaml.safe_load(source.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"{origin}: routing.few_shot.{category}: cannot read {source}: "
                           f"{exc}") from None
    if not isinstance(examples, list):
        raise CatalogError(f"{origin}: routing.few_shot.{category}: {source} is not a list "
                           "of {user, assistant} examples")
    return examples
