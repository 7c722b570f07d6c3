"""The offline tools' commands (calibrate, curves plot, train,
train-complexity, eval): the only way into app/tools from the CLI. Each
imports its tool when it runs, so `joulegate serve` loads none of them."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.artifacts import load_curve
from app.catalog import Catalog, CatalogError, load_catalog
from app.settings import Settings

CatalogOf = Callable[[argparse.Namespace, Settings], Catalog | None]


def add_tool_commands(sub: Any, catalog_of: CatalogOf) -> None:
    """The tools' subcommands, on the CLI's subparsers."""
    dev = sub.add_parser("dev", help="the gateway with local llama.cpp workers (make run)")
    dev.add_argument("--models", help="models.yaml path (default JOULEGATE_MODELS_FILE)")
    dev.set_defaults(func=lambda args: _dev(args, catalog_of))
    cal = sub.add_parser("calibrate", help="measure each backend's operating curve")
    cal.add_argument("--models")
    cal.add_argument("--out", default="curves")
    cal.add_argument("--prompts", default="64,256,1024,4096")
    cal.add_argument("--completions", default="16,64,256,1024,2048")
    cal.add_argument("--concurrency", default="1,2,4,8",
                     help="(default %(default)s) the form is fitted to the smallest and "
                          "largest, those between "
                          "make the curve's batch profile (where the engine's batches "
                          "are dearer or cheaper than the form; docs/routing.md); 1,8 "
                          "for the form alone, in half the time")
    cal.add_argument("--repeat", type=int, default=1)
    cal.add_argument("--backend", action="append", help="only this backend (repeatable)")
    cal.set_defaults(func=lambda args: _calibrate(args, catalog_of))
    curves = sub.add_parser("curves", help="operating curves")
    curves_sub = curves.add_subparsers(dest="curves_command", required=True)
    plot = curves_sub.add_parser("plot", help="draw curves files to a PNG")
    plot.add_argument("files", nargs="+")
    plot.add_argument("--out", default="curves.png")
    plot.set_defaults(func=_plot)
    tr = sub.add_parser("train", help="train the query classifier")
    tr.add_argument("--data", default="../shared/data")
    tr.add_argument("--own", default="router/data/own_prompts.tsv")
    tr.add_argument("--check", default="router/data/eval_prompts.tsv")
    tr.add_argument("--out", default="router/artifacts")
    tr.set_defaults(func=_train)
    tc = sub.add_parser("train-complexity",
                        help="train the per-query complexity model and its quality targets")
    tc.add_argument("--data", default="../shared/data")
    tc.add_argument("--own", default="router/data/difficulty_prompts.tsv,"
                    "router/data/open_prompts.tsv", help="own labelled prompts, comma-separated")
    tc.add_argument("--models", default="deploy/models.gpu.yaml",
                    help="quality table and curves (the reference: H200 curves)")
    tc.add_argument("--out", default="router/artifacts")
    tc.set_defaults(func=_train_complexity)
    ev = sub.add_parser("eval", help="measure the quality table on a live deployment")
    ev.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ev.add_argument("--tiers", default="small,large")
    ev.add_argument("--mmlu", help="folder of <subject>_test.csv files")
    ev.add_argument("--gsm8k", help="GSM8K-format .jsonl file")
    ev.add_argument("--per-subject", type=int, default=5)
    ev.add_argument("--gsm8k-n", type=int, default=50)
    ev.add_argument("--max-tokens", type=int, default=64)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--api-key", help="the gateway's API key (default OPENAI_API_KEY)")
    ev.add_argument("--out", default="bench/results/eval.json")
    ev.set_defaults(func=_eval)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _calibrate(args: argparse.Namespace, catalog_of: CatalogOf) -> int:
    from app.tools.calibrate import Sweep, calibrate

    settings = Settings()
    catalog = catalog_of(args, settings)
    if catalog is None:
        return 2
    sweep = Sweep(_ints(args.prompts), _ints(args.completions), _ints(args.concurrency),
                  args.repeat)
    curves = calibrate(catalog, sweep, Path(args.out), args.backend or None)
    for name, c in curves.items():
        loo = c.fit.get("leave_one_out") or c.fit["holdout"]
        long = loo.get("mape_long")
        print(f"{name}: {c.fit['points']} points; leave-one-out MAPE {loo['mape']:.1%}"
              + (f", {long:.1%} for requests >= 0.5 s" if long is not None else "")
              + f"; R2 {loo.get('r2')} -> {args.out}/{name}.json")
        if c.batch_profile:
            err = c.fit["batch_profile"]
            print(f"{name}: batch profile (measured / form by concurrency) "
                  + ", ".join(f"n={n:g} x{f:.2f}" for n, f in c.batch_profile)
                  + f"; inner points' MAPE {err['mape_form']:.1%} by the form, "
                  f"{err['mape_with_profile']:.1%} with the profile")
        r2 = loo.get("r2")
        if c.fit["points"] < 2 * len(c.coef) or (isinstance(r2, float) and r2 < 0.5):
            print(f"{name}: too few or too alike points for {len(c.coef)} coefficients "
                  f"(R2 {r2}): sweep more prompt lengths, answer lengths and "
                  "concurrencies before trusting this curve", file=sys.stderr)
    return 0


def _plot(args: argparse.Namespace) -> int:
    from app.tools.curves_plot import plot_curves

    try:
        curves = [load_curve(Path(f)) for f in args.files]
    except OSError as exc:
        print(f"joulegate curves plot: cannot read {exc.filename}: {exc.strerror}",
              file=sys.stderr)
        return 2
    except (ValueError, KeyError) as exc:
        print(f"joulegate curves plot: not a curves file: {exc}", file=sys.stderr)
        return 2
    print(plot_curves(curves, Path(args.out)))
    return 0


def _train(args: argparse.Namespace) -> int:
    import json

    from app.tools.training import train

    report = train(Path(args.data), Path(args.own), Path(args.out),
                   check=Path(args.check) if args.check else None)
    print(json.dumps({k: report[k] for k in ("held_out_accuracy", "held_out_n",
                                             "per_source_accuracy")}, indent=2))
    return 0


def _train_complexity(args: argparse.Namespace) -> int:
    import json

    from app.catalog import load_catalog
    from app.tools.complexity_training import train_complexity

    report = train_complexity(Path(args.data), [Path(p) for p in args.own.split(",")],
                              load_catalog(Path(args.models)), Path(args.out))
    print(json.dumps({k: report[k] for k in ("evaluation_held_out", "quality_targets")},
                     indent=2))
    return 0


def _eval(args: argparse.Namespace) -> int:
    import random

    from app.tools.evaluate import evaluate, load_gsm8k, load_mmlu, write

    rng = random.Random(args.seed)
    items = []
    try:
        if args.mmlu:
            items += load_mmlu(Path(args.mmlu), args.per_subject, rng)
        if args.gsm8k:
            items += load_gsm8k(Path(args.gsm8k), args.gsm8k_n, rng)
    except OSError as exc:
        print(f"joulegate eval: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    if not items:
        print("joulegate eval: give --mmlu and/or --gsm8k", file=sys.stderr)
        return 2
    import os

    import httpx

    key = args.api_key or os.environ.get("OPENAI_API_KEY")
    try:
        result = evaluate(args.url.rstrip("/"), args.tiers.split(","), items, args.max_tokens,
                          api_key=key, progress=lambda line: print(line, file=sys.stderr))
    except httpx.HTTPStatusError as exc:
        hint = " (give --api-key or OPENAI_API_KEY)" if exc.response.status_code == 401 else ""
        print(f"joulegate eval: {args.url} answered {exc.response.status_code}: "
              f"{exc.response.text[:200]}{hint}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"joulegate eval: {args.url}: {exc}", file=sys.stderr)
        return 2
    shipped = None
    with contextlib.suppress(CatalogError):  # no models file: the table holds what was measured
        shipped = load_catalog(Path(Settings().models_file)).quality
    write(result, Path(args.out), shipped)
    print(f"{len(items)} items -> {args.out} and {Path(args.out).with_suffix('.yaml')}")
    return 0


def _dev(args: argparse.Namespace, catalog_of: CatalogOf) -> int:
    from app.tools.dev import run

    settings = Settings()
    catalog = catalog_of(args, settings)
    if catalog is None:
        return 2
    return run(Path(args.models or settings.models_file).resolve(), catalog, settings)
