"""The `joulegate` command: serve, agent (and later train, calibrate, eval)."""

from __future__ import annotations

import argparse
import logging
import sys

from app.catalog import CatalogError, load_catalog
from app.settings import Settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.factory import create_app

    settings = Settings()
    if args.models:
        settings = settings.model_copy(update={"models_file": args.models})
    try:
        catalog = load_catalog(settings.models_file)
    except CatalogError as exc:
        print(f"joulegate: bad configuration:\n{exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    app = create_app(settings, catalog)
    uvicorn.run(app, host=args.host or settings.host, port=args.port or settings.port,
                log_level=settings.log_level, access_log=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="joulegate", description="Energy-aware LLM gateway")
    sub = ap.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--models", help="models.yaml path (default JOULEGATE_MODELS_FILE)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.set_defaults(func=_serve)
    args = ap.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
