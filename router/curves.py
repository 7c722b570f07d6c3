"""Operating curves: a backend's expected joules for (prompt, completion, concurrency).

    joules = b0 + b1 P + b2 C + b3 P C + b4 C / n + b5 P C / n + b6 P / n

P prompt tokens, C completion tokens, n requests running at once. Prefill
grows with P, decode with C, attention makes each decode token dearer as the
context grows (P C), and batching shares the weight reads among the n
requests in a step (the /n terms). Non-negative least squares
(scikit-learn) on measurements taken by `joulegate calibrate`; evaluation
is plain arithmetic (microseconds).

An engine need not batch as the /n terms say: llama.cpp's F16 8B on an H100
cost 217 / 180 / 180 J a request at 2 / 3 / 4 clients against 234 J alone
and ~40 J at eight, up to 3x the form fitted to n = 1 and 8
(docs/routing.md, "The 8B between one and eight clients"). A sweep of more
than two concurrencies (`joulegate calibrate --concurrency 1,2,4,8`) fits
the form to its smallest and largest and keeps a *batch profile*: at each
concurrency between, the measured over the fitted joules (the median over
its points), 1 at both ends, linear between; `joules` multiplies by it.
"""

from __future__ import annotations

import bisect
import math
import operator
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

FEATURES = ("1", "P", "C", "PC", "C/n", "PC/n", "P/n")


def features(prompt: float, completion: float, concurrency: float) -> list[float]:
    n = max(1.0, concurrency)
    p, c = prompt / 1000.0, completion / 1000.0  # kilotokens keep the terms comparable
    return [1.0, p, c, p * c, c / n, p * c / n, p / n]


@dataclass(frozen=True)
class Point:
    prompt_tokens: int
    completion_tokens: int
    concurrency: int
    joules: float
    seconds: float


@dataclass(frozen=True)
class Curve:
    backend: str
    device: str
    engine: str
    model: str
    source: str
    date: str
    coef: tuple[float, ...]
    target: str = "gross"  # joules incl. the request's share of idle power
    fit: dict[str, Any] = field(default_factory=dict)
    # What it was measured on, besides model, engine and device: the weights'
    # type (F16, Q4_K_M; a 4-bit model costs other joules than the same at F16)
    # and the engine's build (llama.cpp's b9246, vLLM 0.11.0).
    weights: str = "unknown"
    engine_build: str = "unknown"
    # (n, measured / fitted joules) by concurrency, n ascending; empty: the form
    batch_profile: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if len(self.coef) != len(FEATURES):
            raise ValueError(f"curve {self.backend}: {len(self.coef)} coefficients, "
                             f"{len(FEATURES)} features")
        ns = [n for n, _ in self.batch_profile]
        if ns != sorted(set(ns)) or any(f <= 0 or not math.isfinite(f)
                                        for _, f in self.batch_profile):
            raise ValueError(f"curve {self.backend}: batch_profile needs distinct "
                             "concurrencies in ascending order and positive factors")

    def batch_factor(self, concurrency: float) -> float:
        """The profile's factor at `concurrency` (linear between its points,
        its first and last beyond them); 1 without one."""
        profile = self.batch_profile
        if not profile:
            return 1.0
        i = bisect.bisect_left(profile, concurrency, key=operator.itemgetter(0))
        if i == 0:
            return profile[0][1]
        if i == len(profile):
            return profile[-1][1]
        (n0, f0), (n1, f1) = profile[i - 1], profile[i]
        return f0 + (f1 - f0) * (concurrency - n0) / (n1 - n0)

    def measured_on_other(self, weights: str | None, build: str | None) -> list[str]:
        """How a backend serving `weights` with engine `build` (None: not
        known) differs from what this curve was measured on, in words; empty
        when nothing known differs."""
        out = []
        if weights and self.weights != "unknown" and weights_key(weights) != weights_key(
                self.weights):
            out.append(f"weights {weights} (the curve: {self.weights})")
        if build and self.engine_build != "unknown" and build not in self.engine_build:
            out.append(f"engine build {build} (the curve: {self.engine_build})")
        return out

    def joules(self, prompt: float, completion: float, concurrency: float = 1.0) -> float:
        total: float = sum(map(operator.mul, self.coef, features(prompt, completion,
                                                                  concurrency)))
        if self.batch_profile:
            total *= self.batch_factor(concurrency)
        return max(0.0, total)

    def joins(self, prompt: float, completion: float, running: float) -> float:
        """What one more request adds to a batch of `running`: under the form,
        its own work A(P, C) (the /n terms are the batch's, paid anyway); with
        a profile, (n+1) J(n+1) - n J(n), never less than that own work (a
        request that makes a poor batch a better one is not priced below it)."""
        own = self.joules(prompt, completion, math.inf)
        if not self.batch_profile:
            return own
        n = max(1.0, running)
        added = (n + 1) * self.joules(prompt, completion, n + 1) - n * self.joules(
            prompt, completion, n)
        return max(own, added)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["features"] = list(FEATURES)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Curve:
        return cls(d["backend"], d["device"], d["engine"], d["model"], d["source"], d["date"],
                   tuple(float(c) for c in d["coef"]), d.get("target", "gross"),
                   d.get("fit", {}), d.get("weights", "unknown"),
                   d.get("engine_build", "unknown"),
                   tuple((float(n), float(f)) for n, f in d.get("batch_profile", ())))



def weights_key(name: str) -> str:
    """A weights' type, comparable across spellings: llama.cpp says
    `Q4_K - Medium` where a file name says `Q4_K_M`."""
    head, _, size = name.lower().partition(" - ")
    short = {"medium": "m", "small": "s", "large": "l"}.get(size.strip(), "")
    return "".join(c for c in head if c.isalnum()) + short


def _lstsq(points: list[Point]) -> np.ndarray:
    from sklearn.linear_model import LinearRegression

    x = np.array([features(p.prompt_tokens, p.completion_tokens, p.concurrency)
                  for p in points])
    y = np.array([p.joules for p in points])
    # Relative error matters (small requests must be right too): weight by 1/y.
    w = 1.0 / np.maximum(y, 1e-6)
    model = LinearRegression(positive=True, fit_intercept=False)
    model.fit(x, y, sample_weight=w)
    coef: np.ndarray = model.coef_
    return coef


def _errors(coef: np.ndarray, points: list[Point], min_seconds: float) -> dict[str, Any]:
    if not points:
        return {"n": 0}
    x = np.array([features(p.prompt_tokens, p.completion_tokens, p.concurrency)
                  for p in points])
    y = np.array([p.joules for p in points])
    pred = x @ coef
    ape = np.abs(pred - y) / np.maximum(y, 1e-9)
    long = np.array([p.seconds >= min_seconds for p in points])
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return {
        "n": len(points),
        "mape": float(ape.mean()),
        "mape_long": float(ape[long].mean()) if long.any() else None,
        "n_long": int(long.sum()),
        "long_means_seconds_at_least": min_seconds,
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else None,
    }


def leave_one_out(points: list[Point], min_seconds: float) -> dict[str, Any]:
    """Each point predicted by a fit that never saw it: a held-out error that does
    not hinge on which few points a random split happened to hold out."""
    apes, long_apes, ys, preds = [], [], [], []
    for i, p in enumerate(points):
        coef = _lstsq(points[:i] + points[i + 1:])
        pred = float(np.array(features(p.prompt_tokens, p.completion_tokens, p.concurrency))
                     @ coef)
        ape = abs(pred - p.joules) / max(p.joules, 1e-9)
        apes.append(ape)
        ys.append(p.joules)
        preds.append(pred)
        if p.seconds >= min_seconds:
            long_apes.append(ape)
    y, yp = np.array(ys), np.array(preds)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return {"n": len(points), "mape": float(np.mean(apes)),
            "mape_long": float(np.mean(long_apes)) if long_apes else None,
            "n_long": len(long_apes), "long_means_seconds_at_least": min_seconds,
            "r2": 1.0 - float(((y - yp) ** 2).sum()) / ss_tot if ss_tot > 0 else None}


def _profile(coef: np.ndarray, points: list[Point], ends: tuple[int, int]
             ) -> tuple[tuple[float, float], ...]:
    """Measured over fitted joules at each concurrency between `ends` (the
    median over its points), 1 at the ends."""
    by_n: dict[int, list[float]] = {}
    for p in points:
        fitted = float(np.array(features(p.prompt_tokens, p.completion_tokens,
                                         p.concurrency)) @ coef)
        if ends[0] < p.concurrency < ends[1] and fitted > 0 and p.joules > 0:
            by_n.setdefault(p.concurrency, []).append(p.joules / fitted)
    inner = [(float(n), statistics.median(r)) for n, r in sorted(by_n.items())]
    return ((float(ends[0]), 1.0), *inner, (float(ends[1]), 1.0))


def _profile_errors(curve: Curve, points: list[Point]) -> dict[str, Any]:
    """The inner concurrencies' error by the form alone and with the profile."""
    form = replace(curve, batch_profile=())

    def mape(c: Curve) -> float:
        return float(np.mean([abs(c.joules(p.prompt_tokens, p.completion_tokens,
                                           p.concurrency) - p.joules) / max(p.joules, 1e-9)
                              for p in points]))
    return {"n": len(points), "mape_form": mape(form), "mape_with_profile": mape(curve)}


def fit_curve(points: list[Point], meta: dict[str, str], holdout_fraction: float = 0.25,
              seed: int = 0, min_seconds: float = 0.5) -> Curve:
    """Fit on a random split, report held-out error (and leave-one-out error),
    then refit on all points. Points at more than two concurrencies: the form
    is fitted to the smallest and largest, the others make the batch profile."""
    ns = sorted({p.concurrency for p in points})
    inner: list[Point] = []
    if len(ns) > 2:
        inner = [p for p in points if ns[0] < p.concurrency < ns[-1]]
        points = [p for p in points if p.concurrency in (ns[0], ns[-1])]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(points))
    k = round(len(points) * holdout_fraction)
    held = [points[i] for i in order[:k]]
    train = [points[i] for i in order[k:]]
    coef_train = _lstsq(train)
    fit = {"holdout": _errors(coef_train, held, min_seconds),
           "train": _errors(coef_train, train, min_seconds), "points": len(points),
           "leave_one_out": leave_one_out(points, min_seconds) if len(points) > 8 else None}
    coef = _lstsq(points)
    curve = Curve(meta["backend"], meta["device"], meta["engine"], meta["model"],
                  meta["source"], meta["date"], tuple(float(c) for c in coef),
                  meta.get("target", "gross"), fit, meta.get("weights", "unknown"),
                  meta.get("engine_build", "unknown"),
                  _profile(coef, inner, (ns[0], ns[-1])) if inner else ())
    if inner:
        fit["batch_profile"] = _profile_errors(curve, inner)
    return curve
