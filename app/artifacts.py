"""The router's artifacts on disk: the classifier pickle, the complexity model,
the operating curves. router/ computes with them and never reads a file; this
module reads and writes them.

The pickle pins `router.classifier.char_view` by module path: that function
stays where it is, or the shipped classifier.pkl no longer loads. Serving
reads the classifier's arrays saved beside it (classifier.npz), not the
pickle.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import router
from app.catalog import Catalog
from router.classifier import Classifier, ClassifierArrays
from router.complexity import ComplexityModel, calibrate_ability
from router.curves import Curve
from router.engine import Targets

log = logging.getLogger("joulegate.artifacts")

ARTIFACTS = Path(router.__file__).resolve().parent / "artifacts"  # shipped with the package
CLASSIFIER = ARTIFACTS / "classifier.pkl"
COMPLEXITY = ARTIFACTS / "complexity.npz"


ARRAYS_FORMAT = 1  # classifier.npz's layout (ClassifierArrays); another is not read
TERMS_SEP = "\x00"  # between a vocabulary's terms (no term holds it: checked on saving)


def arrays_path(pickle_path: Path) -> Path:
    """Where a classifier pickle's arrays are saved: beside it, `.npz`."""
    return pickle_path.with_suffix(".npz")


def load_classifier(path: Path = CLASSIFIER, with_pipeline: bool = False) -> Classifier:
    """The classifier at `path` (a pickle, or its arrays' `.npz`). From a
    pickle, its arrays are read instead where they were saved beside it from
    that very pickle (their `source_sha256`): no scikit-learn is imported and
    no pickle runs, and a gateway process starts ~2 s sooner with ~100 MiB
    less (docs/performance-decisions.md). `with_pipeline`: the fitted
    scikit-learn pipeline too (training, the check against the fast path)."""
    if path.suffix == ".npz":
        if with_pipeline:
            raise ValueError(f"{path} holds a classifier's arrays, not its pipeline: "
                             "name its .pkl")
        return Classifier(_read_arrays(path).arrays)
    if not with_pipeline:
        beside = arrays_path(path)
        if beside.exists():
            arrays = _read_arrays(beside)
            if arrays.source_sha256 == _sha256(path):
                return Classifier(arrays.arrays)
            log.warning("%s was saved from another %s: loading the pickle instead "
                        "(joulegate train writes both)", beside, path.name)
    with path.open("rb") as f:
        return Classifier.of_pipeline(pickle.load(f))


def save_classifier(classifier: Classifier, path: Path) -> None:
    """The fitted pipeline, pickled at `path`, and its arrays beside it."""
    with path.open("wb") as f:
        pickle.dump(classifier.pipeline, f, protocol=pickle.HIGHEST_PROTOCOL)
    save_arrays(classifier.arrays, arrays_path(path), _sha256(path))


def save_arrays(arrays: ClassifierArrays, path: Path, source_sha256: str) -> None:
    def blob(terms: list[str]) -> np.ndarray:
        if any(TERMS_SEP in t for t in terms):
            raise ValueError("a vocabulary term holds the separator")
        return np.frombuffer(TERMS_SEP.join(terms).encode(), dtype=np.uint8)

    with path.open("wb") as f:  # np.savez would add .npz to a name without it
        np.savez_compressed(
            f, format=np.array(ARRAYS_FORMAT), source_sha256=np.array(source_sha256),
            labels=np.array(arrays.labels), word_terms=blob(arrays.word_terms),
            word_count=np.array(len(arrays.word_terms)), char_terms=blob(arrays.char_terms),
            char_count=np.array(len(arrays.char_terms)), idf=arrays.idf, coef=arrays.coef,
            intercept=arrays.intercept)


@dataclass(frozen=True)
class SavedArrays:
    arrays: ClassifierArrays
    source_sha256: str  # of the pickle they were saved from ("" if none)


def _read_arrays(path: Path) -> SavedArrays:
    with np.load(path, allow_pickle=False) as z:
        if int(z["format"]) != ARRAYS_FORMAT:
            raise ValueError(f"{path}: arrays of format {int(z['format'])}, this joulegate "
                             f"reads {ARRAYS_FORMAT}: run joulegate train again")

        def terms(name: str) -> list[str]:
            count = int(z[f"{name}_count"])
            found = bytes(z[f"{name}_terms"]).decode().split(TERMS_SEP) if count else []
            if len(found) != count:
                raise ValueError(f"{path}: {name} vocabulary of {len(found)} terms, "
                                 f"{count} expected")
            return found

        arrays = ClassifierArrays(
            [str(x) for x in z["labels"]], terms("word"), terms("char"),
            np.asarray(z["idf"], dtype=np.float64),
            np.ascontiguousarray(z["coef"], dtype=np.float64),
            np.asarray(z["intercept"], dtype=np.float64))
        return SavedArrays(arrays, str(z["source_sha256"]))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_curve(path: Path) -> Curve:
    return Curve.from_json(json.loads(path.read_text()))


def curve_warnings(catalog: Catalog, said: dict[str, tuple[str | None, str | None]]
                   ) -> list[str]:
    """A line per backend whose curve was measured on other weights or another
    engine build than its workers say they run (`said`: backend -> (weights,
    build), from the workers or the models file's `weights`)."""
    out = []
    for b in catalog.backends:
        if not b.curves:
            continue
        weights, build = said.get(b.name, (None, None))
        differs = load_curve(catalog.path(b.curves)).measured_on_other(
            weights or b.weights, build)
        if differs:
            what = "other weights" if any(d.startswith("weights") for d in differs) \
                else "another engine build"
            out.append(f"{b.name}: serves {'; '.join(differs)}: its energy estimates and "
                       f"routing are priced for {what}. Measure its own curve: "
                       f"joulegate calibrate --backend {b.name} --out curves/")
    return out


def save_curve(curve: Curve, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(curve.to_json(), indent=2) + "\n")


def load_complexity(path: Path, default_target: float,
                    quality: Mapping[str, Mapping[str, float]] | None = None,
                    report: dict[str, Any] | None = None
                    ) -> tuple[ComplexityModel | None, Targets]:
    """The complexity model (`joulegate train-complexity`: arrays and report side
    by side); without it the router falls back to the category table. With the
    models file's `quality` table, a level it gives otherwise than the table
    the model was trained with is calibrated here, on the reference items'
    difficulty (the report's quantiles): a pair of other models routes by its
    own figures. `report`: the report, where the caller has read it already."""
    report = report if report is not None else complexity_report(path)
    if report is None:
        log.warning("no complexity model at %s: routing by category averages", path)
        return None, Targets(default_target=default_target)
    arrays = np.load(path)
    stretch = report.get("easy_stretch", {})
    model = ComplexityModel(arrays["text_coef"], arrays["hand_coef"], arrays["hand_mean"],
                            arrays["hand_scale"], float(arrays["intercept"][0]),
                            abilities(report, quality), float(stretch.get("pivot", 0.0)),
                            float(stretch.get("factor", 1.0)))
    targets = {float(t): float(v) for t, v in report["quality_targets"].items()}
    return model, Targets(targets, default_target)


def complexity_report(path: Path) -> dict[str, Any] | None:
    """The report beside a complexity model's arrays (None: no model there)."""
    report_path = path.with_name(path.stem + "-report.json")
    if not path.exists() or not report_path.exists():
        return None
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report


def abilities(report: Mapping[str, Any], quality: Mapping[str, Mapping[str, float]] | None
              ) -> dict[str, dict[str, float]]:
    """The report's abilities, with a level the `quality` table gives
    otherwise (or newly) calibrated on the category's reference difficulty."""
    out = {c: dict(row) for c, row in report["abilities"].items()}
    trained = report.get("levels_table", {})
    thetas = report.get("reference_thetas", {})
    for cat, row in (quality or {}).items():
        for act, q in row.items():
            if trained.get(cat, {}).get(act) == q and act in out.get(cat, {}):
                continue
            ref = thetas.get(cat) or [t for ts in thetas.values() for t in ts]
            if ref:
                out.setdefault(cat, {})[act] = round(calibrate_ability(ref, q), 4)
    return out
