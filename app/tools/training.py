"""Training data and training of the query classifier (`joulegate train`).

Sources (each cited in the training report):
- MMLU (Hendrycks et al., MIT): question stems only (choices dropped, so the
  model learns topics, not the multiple-choice format), subject -> category.
- GSM8K train (Cobbe et al., MIT): math word problems.
- Arena-Hard v0.1 (lmarena, Apache-2.0): real user prompts; its topic
  clusters are mapped to categories by keywords (CLUSTER_RULES).
- router/data/own_prompts.tsv: this project's own labeled prompts for what
  those sets lack (casual chat, creative writing, role-play, rewriting,
  summarising and extracting, everyday coding), written here.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from app.artifacts import save_classifier
from app.tools.augment import templated
from router.classifier import CATEGORIES, Classifier, build_pipeline, prepare

MMLU_CATEGORY: dict[str, str] = {}
for _cat, _subjects in {
    "math": "abstract_algebra college_mathematics elementary_mathematics "
            "high_school_mathematics high_school_statistics",
    "reasoning": "formal_logic logical_fallacies",
    "science": "anatomy astronomy college_biology college_chemistry college_computer_science "
               "college_medicine college_physics computer_security conceptual_physics "
               "electrical_engineering high_school_biology high_school_chemistry "
               "high_school_computer_science high_school_physics machine_learning "
               "medical_genetics nutrition virology clinical_knowledge professional_medicine "
               "human_aging",
    "knowledge": "global_facts high_school_european_history high_school_us_history "
                 "high_school_world_history prehistory world_religions philosophy "
                 "miscellaneous international_law jurisprudence professional_law "
                 "high_school_geography",
    "social": "business_ethics econometrics high_school_government_and_politics "
              "high_school_macroeconomics high_school_microeconomics high_school_psychology "
              "human_sexuality management marketing moral_disputes moral_scenarios "
              "professional_accounting professional_psychology public_relations "
              "security_studies sociology us_foreign_policy",
}.items():
    for _s in _subjects.split():
        MMLU_CATEGORY[_s] = _cat

# Arena-Hard cluster name keywords -> category; first match wins, order matters.
CLUSTER_RULES: list[tuple[str, str]] = [
    ("extraction", r"extraction|sentiment|review analysis|tagging|query transformation"),
    ("writing", r"story|poem|writing|slide|debate|rpg creation|character interactions|satire|"
                r"dialog|panel discussion|rehearsed|melody|prompt engineering"),
    ("reasoning", r"puzzle|riddle|pattern completion|logic|situation|conflicting instructions|"
                  r"comparative truths|lambda calculus"),
    ("math", r"math|algebra|number theory|probability|statistic|geometry|calculat|continuity|"
             r"proving|prime and perfect|dice|standard deviation|sample size|investment growth|"
             r"train time|draws|step count|ticket pricing"),
    ("code", r"python|code|coding|javascript|typescript|sql|rust|c\+\+|css|react|django|flask|"
             r"docker|kubernetes|linux|php|kotlin|swift|android|script|development|program|"
             r"regex|vba|excel|pandas|matplotlib|pytorch|jax|cuda|hdl|shader|awk|node\.js|"
             r"laravel|symfony|wpf|tkinter|streamlit|gradio|shiny|tidyverse|nix|cron|scraping|"
             r"algorithm|linked list|array|string|fibonacci|assembly|testing|mocking|monads|"
             r"gui|api|web|database|concurrency|autoencoder|rnn|yolo|ffmpeg|bot|odoo|sap|"
             r"databricks|gis|json|csv|subtitle|terminal|package|chatbot|huggingface|"
             r"random number|indexing|word position|reverse engineering|deobfuscation"),
    ("science", r"physics|electromagnetic|quantum|radiology|medical|sensor|radar|kalman|signal|"
                r"circular motion|water waves|gpu|vram|transformers|machine learning|deep|"
                r"gradient|batch size|climate|weather|solar|mining|network|wifi|security|"
                r"cryptograph|jpeg|ram|ray tracing|sequence alignment|image|vector|hashing"),
    ("social", r"business|marketing|strategy|finance|banking|investment|tax|trading|stock|"
               r"pricing|economet|agile|startup|sales|profit|commission|commerce|seo|grocery|"
               r"advertising|hospital|management|teaching|leadership|cio|data scientist|"
               r"philosophy|theology|cheating|preppers|contemporary"),
    ("knowledge", r"history|housebuilding|library|language|translation|etymology|words|"
                  r"chess|card games|guitar|recipes|meal|training|keyboard|iso|patent|"
                  r"elo|lojban|legal|acrobat|pdf"),
]


@dataclass(frozen=True)
class Example:
    text: str
    category: str
    source: str


def _mmlu(data: Path, per_subject: int, rng: random.Random) -> list[Example]:
    out = []
    for path in sorted((data / "mmlu" / "test").glob("*_test.csv")):
        subject = path.name.removesuffix("_test.csv")
        cat = MMLU_CATEGORY.get(subject)
        if cat is None:
            continue
        with path.open(newline="") as f:
            rows = [r[0] for r in csv.reader(f) if r]
        rng.shuffle(rows)
        out += [Example(q, cat, f"mmlu:{subject}") for q in rows[:per_subject]]
    return out


def _gsm8k(data: Path, n: int, rng: random.Random) -> list[Example]:
    with (data / "gsm8k" / "train.jsonl").open() as f:
        qs = [json.loads(line)["question"] for line in f]
    rng.shuffle(qs)
    return [Example(q, "math", "gsm8k") for q in qs[:n]]


def cluster_category(cluster: str) -> str | None:
    name = cluster.lower()
    for cat, pattern in CLUSTER_RULES:
        if re.search(pattern, name):
            return cat
    return None


def _arena(data: Path) -> list[Example]:
    out = []
    with (data / "arena-hard" / "v0.1-question.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            cat = cluster_category(row["cluster"])
            if cat is not None:
                out.append(Example(row["prompt"], cat, "arena-hard"))
    return out


def _own(path: Path) -> list[Example]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            cat, text = line.split("\t", 1)
            assert cat in CATEGORIES, cat
            out.append(Example(text, cat, "own"))
    return out


def load_examples(data: Path, own: Path, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    filled = [Example(t, c, "template") for c, t in templated(250, seed)]
    return _mmlu(data, 60, rng) + _gsm8k(data, 600, rng) + _arena(data) + _own(own) + filled


def _split(examples: list[Example], seed: int) -> tuple[list[Example], list[Example]]:
    """Stratified 80/20 split per (category, source)."""
    rng = random.Random(seed)
    groups: dict[tuple[str, str], list[Example]] = {}
    for e in examples:
        groups.setdefault((e.category, e.source.split(":")[0]), []).append(e)
    train, test = [], []
    for g in groups.values():
        rng.shuffle(g)
        k = max(1, len(g) // 5) if len(g) >= 5 else 0
        test += g[:k]
        train += g[k:]
    return train, test


def _weights(examples: list[Example]) -> list[float]:
    """Balance the categories: each contributes equal total weight; own
    prompts count triple (they are the only real-traffic-like examples)."""
    counts = Counter(e.category for e in examples)
    return [(3.0 if e.source == "own" else 1.0) * len(examples) / (len(counts) * counts[e.category])
            for e in examples]


def train(data: Path, own: Path, out_dir: Path, seed: int = 0,
          check: Path | None = None) -> dict[str, object]:
    """Train, evaluate on a held-out split, then refit on everything and save."""
    from sklearn.metrics import confusion_matrix

    examples = load_examples(data, own, seed)
    train_set, test_set = _split(examples, seed)
    pipe = build_pipeline()
    pipe.fit([prepare(e.text) for e in train_set], [e.category for e in train_set],
             clf__sample_weight=_weights(train_set))
    clf = Classifier.of_pipeline(pipe)
    predicted = [clf.top(e.text) for e in test_set]
    truth = [e.category for e in test_set]
    labels = list(CATEGORIES)
    per_cat = {}
    for c in labels:
        idx = [i for i, t in enumerate(truth) if t == c]
        per_cat[c] = {"n": len(idx),
                      "accuracy": sum(predicted[i] == c for i in idx) / len(idx) if idx else None}
    by_source: dict[str, list[bool]] = {}
    for e, p in zip(test_set, predicted, strict=True):
        by_source.setdefault(e.source.split(":")[0], []).append(p == e.category)
    report: dict[str, object] = {
        "held_out_accuracy": sum(p == t for p, t in zip(predicted, truth, strict=True))
        / len(truth),
        "held_out_n": len(truth),
        "per_category": per_cat,
        "per_source_accuracy": {s: sum(v) / len(v) for s, v in by_source.items()},
        "confusion_matrix": {"labels": labels,
                             "rows_true_cols_predicted":
                                 confusion_matrix(truth, predicted, labels=labels).tolist()},
        "training_examples": dict(Counter(e.category for e in examples)),
        "sources": {
            "mmlu": "Hendrycks et al., Measuring Massive Multitask Language Understanding "
                    "(MIT); question stems, 60 per subject",
            "gsm8k": "Cobbe et al., Training Verifiers to Solve Math Word Problems (MIT); "
                     "600 train questions",
            "arena-hard": "lmarena/arena-hard-auto v0.1 questions (Apache-2.0); clusters "
                          "mapped to categories by app/tools/training.py CLUSTER_RULES",
            "own": "router/data/own_prompts.tsv, written for joulegate",
            "template": "app/tools/augment.py: templated writing, extraction, code and chat "
                        "prompts filled with passages and topics from every domain",
        },
        "seed": seed,
    }
    if check is not None:
        checks = _own(check)
        got = clf.top_many([e.text for e in checks])
        report["check_set"] = {
            "file": str(check.name), "n": len(checks),
            "accuracy": sum(g == e.category for g, e in zip(got, checks, strict=True))
            / len(checks),
            "misses": [{"text": e.text[:80], "true": e.category, "predicted": g}
                       for g, e in zip(got, checks, strict=True) if g != e.category],
        }
    final = build_pipeline()
    final.fit([prepare(e.text) for e in examples], [e.category for e in examples],
              clf__sample_weight=_weights(examples))
    out_dir.mkdir(parents=True, exist_ok=True)
    save_classifier(Classifier.of_pipeline(final), out_dir / "classifier.pkl")
    (out_dir / "classifier-report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
