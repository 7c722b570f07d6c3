"""Building the router from the catalog, and keeping what it learns from traffic."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from app.artifacts import (
    CLASSIFIER,
    COMPLEXITY,
    complexity_report,
    load_classifier,
    load_complexity,
    load_curve,
)
from app.catalog import Catalog
from router.curves import Curve
from router.decision import Decision
from router.engine import Router, Targets
from router.fewshot import FewShot
from router.policy import ActionSpec, Caps, Policy
from router.pricing import LoadPricing, Site
from router.quality import ExpectedLengths, QualityTable, action
from router.targets import sweep
from router.thinking import THINKING_TOKENS, ThinkingModel

log = logging.getLogger("joulegate.routing")


class LengthBook:
    """Expected completion lengths, learned from traffic and persisted to a file."""

    def __init__(self, path: Path | None, save_every: int = 50) -> None:
        self.path = path
        self._save_every = save_every
        self._since_save = 0
        self.lengths = ExpectedLengths()
        if path is not None and path.exists():
            try:
                self.lengths = ExpectedLengths.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, AssertionError) as exc:
                log.warning("ignoring unreadable %s: %s", path, exc)

    def observe(self, d: Decision, completion_tokens: int, thinking_tokens: int = 0) -> None:
        """A routed request's lengths. A reasoning backend's answer is learned
        apart from its thinking (`tier:direct`), and its thinking (`tier:think`)
        where the span ended within its budget (a cut-off span says only that
        the model would have thought at least that long: learned only where
        it is above what was expected)."""
        if not d.routed or completion_tokens <= 0:
            return
        if d.thinking_budget is None:
            self.lengths.observe(d.category, action(d.tier, d.strategy), completion_tokens)
        else:
            self.lengths.observe(d.category, action(d.tier, "direct"),
                                 max(1, completion_tokens - thinking_tokens))
            if thinking_tokens > 0:
                think = action(d.tier, "think")
                known = self.lengths.values.get(d.category, {}).get(think)
                if thinking_tokens < d.thinking_budget or known is None \
                        or thinking_tokens > known:
                    self.lengths.observe(d.category, think, thinking_tokens)
        self._since_save += 1
        if self._since_save >= self._save_every:
            self.save()

    def save(self) -> None:
        if self.path is None:
            return
        self._since_save = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.lengths.to_json()))
            tmp.replace(self.path)
        except OSError as exc:
            log.warning("cannot save %s: %s", self.path, exc)


def build_router(catalog: Catalog, book: LengthBook) -> Router:
    r = catalog.routing
    classifier = load_classifier(catalog.path(r.classifier) if r.classifier else CLASSIFIER)
    unknown = sorted(set(r.few_shot) - set(classifier.labels))
    if unknown:
        log.warning("routing.few_shot: %s not among the classifier's categories (%s): "
                    "never offered", ", ".join(unknown), ", ".join(classifier.labels))
    actions = [ActionSpec(b.tier, b.name, s, b.reasoning)
               for t in catalog.tiers for b in catalog.backends_of(t) for s in r.strategies]
    if r.few_shot:  # examples help a model that answers directly (router.fewshot)
        actions += [ActionSpec(b.tier, b.name, "fewshot") for t in catalog.tiers
                    for b in catalog.backends_of(t) if not b.reasoning]
    curves = catalog_curves(catalog)
    policy = Policy(actions, QualityTable(catalog.quality), book.lengths, curves,
                    catalog.tiers, r.tolerance,
                    Caps(r.direct_max_tokens, r.cot_max_tokens),
                    sites(catalog), thinking_model(catalog), few_shot(catalog),
                    LoadPricing(r.batch_pricing, r.colocation_penalty,
                                r.share_at_most_in_flight), r.full_tolerance_from)
    path = catalog.path(r.complexity) if r.complexity else COMPLEXITY
    report = complexity_report(path)
    model, targets = load_complexity(path, r.quality_target, catalog.quality, report)
    router = Router(classifier, policy, catalog.tiers[-1], model, targets)
    if report is not None and _other_levels(catalog, report) \
            and report.get("reference_workload"):
        # Levels or actions other than those the targets were calibrated with:
        # calibrate them again, for this models file, on the same workload.
        found, _ = reference_targets(router, report["reference_workload"])
        router.targets = Targets({float(t): v for t, v in found.items()}, r.quality_target)
    return router


def _other_levels(catalog: Catalog, report: dict[str, Any]) -> bool:
    """Whether the report's targets were calibrated for other levels, actions
    or tolerance scaling (a report without `full_tolerance_from` predates it: 0)."""
    return catalog.quality != report.get("levels_table") \
        or any(b.reasoning for b in catalog.backends) or bool(catalog.routing.few_shot) \
        or catalog.routing.full_tolerance_from != report.get("full_tolerance_from", 0.0)


def few_shot(catalog: Catalog) -> FewShot:
    """The models file's worked examples per category."""
    return FewShot.of({cat: [(e.user, e.assistant) for e in examples]
                       for cat, examples in catalog.routing.few_shot.items()})


def reference_targets(router: Router, workload: list[list[Any]]
                      ) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Quality targets -> tolerances for `router` on the reference workload
    (category probabilities, difficulty, prompt tokens per request), priced
    alone."""
    model = router.model
    assert model is not None
    keys = [a.key for a in router.policy.actions]
    assessed = [router.policy.candidates(probs, int(tokens), None, {},
                                         model.qualities(theta, probs, keys),
                                         theta - model.pivot)
                for probs, theta, tokens in workload]
    return sweep(router.policy, assessed, router.tiers[1])


def catalog_curves(catalog: Catalog) -> dict[str, Curve]:
    """Each backend's operating curve, where it has one."""
    return {b.name: load_curve(catalog.path(b.curves)) for b in catalog.backends if b.curves}


def thinking_model(catalog: Catalog) -> ThinkingModel:
    r = catalog.routing
    return ThinkingModel(tuple(sorted(set(r.thinking_budgets))), r.max_thinking_tokens,
                         {**THINKING_TOKENS, **r.thinking_tokens})


def sites(catalog: Catalog) -> dict[str, Site]:
    """Each backend's replica count and the backends sharing a device with it."""
    devices = {b.name: {r.device for r in b.replicas} for b in catalog.backends}
    return {b.name: Site(len(b.replicas), frozenset(
                o for o, theirs in devices.items() if o != b.name and theirs & devices[b.name]))
            for b in catalog.backends}
