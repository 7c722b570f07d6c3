"""The `joulegate` command: serve, keys, usage, agent; the offline tools' commands
(calibrate, curves, train, train-complexity, eval) come from app.tools.commands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from app.catalog import Catalog, CatalogError, load_catalog
from app.settings import Settings, is_loopback
from app.tools.commands import add_tool_commands

if TYPE_CHECKING:
    from app.catalog import Device
    from app.tenancy.keys import KeyStore
    from telemetry.agent import AgentServer
    from telemetry.devices import MeteredDevice
    from telemetry.sampler import Sampler


def _catalog(args: argparse.Namespace, settings: Settings) -> Catalog | None:
    """models.yaml from --models or the settings; None (after saying why) if bad."""
    try:
        return load_catalog(Path(args.models or settings.models_file))
    except CatalogError as exc:
        print(f"joulegate: bad configuration:\n{exc}", file=sys.stderr)
        return None


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.factory import create_app

    settings = Settings()
    if args.models:
        settings = settings.model_copy(update={"models_file": args.models})
    catalog = _catalog(args, settings)
    if catalog is None:
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    logging.getLogger("joulegate").info("models file %s", Path(settings.models_file).resolve())
    host, port = args.host or settings.host, args.port or settings.port
    settings = settings.model_copy(update={"host": host, "port": port})
    if not _may_serve(settings, host, args.allow_unauthenticated) \
            or not _sources_work(catalog, settings) or not _agent_token_readable(settings):
        return 2
    if args.workers <= 1:
        from app.http.connection import uvicorn_options

        uvicorn.run(create_app(settings, catalog), host=host, port=port,
                    log_level=settings.log_level,
                    **uvicorn_options(settings.head_timeout_seconds, settings.max_connections,
                                      settings.max_connections_per_client))
        return 0
    return _serve_processes(args.workers, settings, catalog, host, port)


def _sources_work(catalog: Catalog, settings: Settings) -> bool:
    """Whether every device metered in this process has a working energy
    source (say which does not, in one line each)."""
    from app.factory import device_spec
    from telemetry.devices import make_reader
    from telemetry.reader import ReaderError

    ok = True
    for i, d in enumerate(catalog.devices):
        if d.agent or settings.agent_url:
            continue  # metered by its agent, on its own host
        try:
            make_reader(device_spec(d)).close()
        except ReaderError as exc:
            print(f"joulegate: {settings.models_file}: devices.{i} ({d.name}): source "
                  f"{d.source}: {exc} (on a host without it: source: auto, rapl or estimate)",
                  file=sys.stderr)
            ok = False
    return ok


def _agent_token_readable(settings: Settings) -> bool:
    try:
        settings.agent_secret()
    except ValueError as exc:
        print(f"joulegate: {exc}", file=sys.stderr)
        return False
    return True


def _may_serve(settings: Settings, host: str, allow_unauthenticated: bool) -> bool:
    """A non-loopback bind needs an API key (or an explicit opt-out)."""
    from app.tenancy.keys import KeyRing, KeyStore

    if is_loopback(host) or allow_unauthenticated or settings.allow_unauthenticated:
        return True
    store = KeyStore(settings.database())
    try:
        if settings.bootstrap_key:
            _bootstrap(settings, store)
        if KeyRing(store).active():
            return True
    finally:
        store.close()
    print(f"joulegate: refusing to serve {host} without an API key. Create one with "
          "`joulegate keys create --name NAME`, or pass --allow-unauthenticated "
          "(JOULEGATE_ALLOW_UNAUTHENTICATED=true).", file=sys.stderr)
    return False


def _bootstrap(settings: Settings, store: KeyStore) -> None:
    """First start of a container: an admin key (unless JOULEGATE_ADMIN_KEY is
    set) and a client key named `first`, each in a mode-600 file of the state
    volume; the log says where and how to use them, never the keys."""
    from app.tenancy.keys import KeyRing, kept_secret

    state = settings.state_dir
    if settings.admin_key is None and not (state / "admin-key").exists():
        kept_secret(state / "admin-key", create=True)
        print(f"joulegate: created the admin key in {state / 'admin-key'}; it manages keys "
              "(`joulegate keys create --name team-a`, or POST /v1/admin/keys with "
              "'Authorization: Bearer <admin key>') and sees all usage (GET /v1/usage).",
              file=sys.stderr)
    if not KeyRing(store).active():
        _, secret = store.create("first")
        path = state / "first-key"
        path.touch(mode=0o600)
        path.write_text(secret + "\n")
        print(f"joulegate: created the API key 'first' in {path}. Clients send it as "
              "'Authorization: Bearer <key>' (the OpenAI SDK's api_key). Under docker "
              f"compose: `docker compose exec -T gateway cat {path}` (gateway-cpu or "
              "gateway-vllm under those profiles; -T: no terminal, so no carriage return "
              "ends the key).", file=sys.stderr)


def _keys(args: argparse.Namespace) -> int:
    import json

    from app.tenancy.keys import KeyStore

    if args.action != "list" and not args.name:
        print(f"joulegate: keys {args.action} needs --name", file=sys.stderr)
        return 2
    store = KeyStore(Settings().database())
    try:
        if args.action == "create":
            key, secret = store.create(args.name, args.rpm, args.tpm, args.joule_budget,
                                       args.budget_period or "month", _names(args.models))
            print(json.dumps({**key.public(), "key": secret}, indent=2))
            print("The key is shown once; only its hash is stored.", file=sys.stderr)
        elif args.action == "list":
            print(json.dumps([_readable(k.public()) for k in store.all()], indent=2))
        elif args.action == "revoke":
            if not store.revoke(args.name):
                print(f"joulegate: no active key named {args.name!r}", file=sys.stderr)
                return 1
        else:
            fields: dict[str, object] = {
                k: getattr(args, k) for k in ("rpm", "tpm", "joule_budget", "budget_period")
                if getattr(args, k) is not None}
            if args.models is not None:
                fields["models"] = _names(args.models)
            if not store.update(args.name, **fields):
                print(f"joulegate: no key named {args.name!r}", file=sys.stderr)
                return 1
    except ValueError as exc:
        print(f"joulegate: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    return 0


def _readable(public: dict[str, object]) -> dict[str, object]:
    """A key's public fields with its times in UTC ISO 8601 (not epoch seconds)."""
    import datetime as dt

    out = dict(public)
    for name in ("created", "revoked"):
        t = out.get(name)
        if isinstance(t, int | float):
            out[name] = dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def _since(text: str) -> float | None:
    """The start of a --since window (a time.time()), or None after saying why."""
    import time

    from app.tenancy.spend import parse_since

    seconds = parse_since(text)
    if seconds is None:
        print("joulegate: --since takes a number and a unit, e.g. 1h or 7d", file=sys.stderr)
        return None
    return time.time() - seconds


def _usage(args: argparse.Namespace) -> int:
    import json

    from app.tenancy.spend import SpendLedger

    since = _since(args.since)
    if since is None:
        return 2
    settings = Settings()
    if args.key:
        from app.tenancy.keys import KeyStore

        store = KeyStore(settings.database())
        known = {k.name for k in store.all()}
        store.close()
        if args.key not in known:
            print(f"joulegate: no key named {args.key!r} (joulegate keys list)", file=sys.stderr)
            return 2
    ledger = SpendLedger(settings.database())
    try:
        print(json.dumps(ledger.totals(None, since, args.key or None), indent=2))
    finally:
        ledger.close()
    return 0


def _report(args: argparse.Namespace) -> int:
    import json

    from app.routing import catalog_curves
    from app.tenancy.report import build_report, table
    from app.tenancy.spend import SpendLedger

    since = _since(args.since)
    if since is None:
        return 2
    settings = Settings()
    if args.gateway:  # a live gateway's: the same figures, and its devices' tail energy
        import os

        from app.tools.live_report import Unavailable, live_report

        try:
            report = live_report(args.gateway, args.since, args.reference,
                                 args.key or os.environ.get("JOULEGATE_API_KEY"))
        except Unavailable as exc:
            print(f"joulegate report: {exc}", file=sys.stderr)
            return 1
    else:
        catalog = _catalog(args, settings)
        if catalog is None:
            return 2
        ledger = SpendLedger(settings.database())
        try:
            groups = ledger.report_groups(since)
        finally:
            ledger.close()
        report = {"since": args.since, **build_report(groups, catalog_curves(catalog),
                                                      args.reference)}
    print(json.dumps(report, indent=2) if args.json else table(report))
    if args.plot:
        from app.tools.report_plot import plot_report

        plot_report(report, Path(args.plot))
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def _serve_processes(workers: int, settings: Settings, catalog: Catalog, host: str,
                     port: int) -> int:
    """N gateway processes on one port (app.processes: a listening socket
    each). Energy is metered once, by an agent: the
    one JOULEGATE_AGENT_URL names, or one started here in this (parent)
    process; metrics are merged across the processes (Prometheus multiprocess
    mode); learned lengths are saved by each process to the same file."""
    import os
    import tempfile
    from urllib.parse import quote

    from app.processes import ServeConfig, listening_socket, serve_processes
    from app.tenancy.database import migrate

    migrate(settings.database())  # once, before the processes open the database
    try:
        sockets = [listening_socket(host, port) for _ in range(workers)]
    except OSError as exc:
        print(f"cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 2

    env = {"JOULEGATE_MODELS_FILE": str(Path(settings.models_file).resolve()),
           "JOULEGATE_HOST": host, "JOULEGATE_PORT": str(port)}
    if not settings.agent_url:
        # On a Unix socket (in a directory only this user may enter): the
        # processes' calls cost the agent and them less than over loopback
        # TCP. A token of its own all the same.
        import secrets

        path = str(Path(tempfile.mkdtemp(prefix="joulegate-agent-")) / "agent.sock")
        token = secrets.token_urlsafe(32)
        _start_agent(catalog.devices, settings.sample_hz, socket_path=path, token=token,
                     quiet_hz=settings.sample_hz_quiet)
        env["JOULEGATE_AGENT_URL"] = "http+unix://" + quote(path, safe="")
        env["JOULEGATE_AGENT_TOKEN"] = token
        logging.getLogger("joulegate").warning(
            "%d gateway processes; energy metered by the agent at %s", workers,
            env["JOULEGATE_AGENT_URL"])
    env.setdefault("PROMETHEUS_MULTIPROC_DIR", os.environ.get(
        "PROMETHEUS_MULTIPROC_DIR") or tempfile.mkdtemp(prefix="joulegate-metrics-"))
    os.environ.update(env)
    return serve_processes(
        ServeConfig("app.factory:app_from_env", host, port, settings.log_level,
                    settings.head_timeout_seconds, settings.max_connections,
                    settings.max_connections_per_client), sockets)


def _start_agent(devices: list[Device], sample_hz: float, host: str = "127.0.0.1",
                 port: int = 0, socket_path: str | None = None, token: str | None = None,
                 quiet_hz: float | None = None
                 ) -> tuple[AgentServer, list[Sampler], dict[str, MeteredDevice]]:
    """Meter `devices` (a sampler each) and serve their ledgers at host:port
    (or on the Unix socket `socket_path`), to callers with `token`."""

    from app.factory import device_spec
    from telemetry.agent import start_agent
    from telemetry.devices import metered_device, start_samplers, wait_for_readings
    from telemetry.metrics import Metrics

    metered = {d.name: metered_device(device_spec(d), d.prefill_weight) for d in devices}
    samplers = start_samplers(metered.values(), sample_hz, quiet_hz)
    wait_for_readings(samplers)  # windows closed before a first reading would keep 0 J
    server, _ = start_agent(host, port, metered, Metrics(), _new_loop(),
                            socket_path, token)
    return server, samplers, metered


def _new_loop() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's event loop where it is installed (uvicorn[standard] brings it;
    several times less CPU per agent call), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def _agent(args: argparse.Namespace) -> int:
    import signal
    import threading

    settings = Settings()
    catalog = _catalog(args, settings)
    if catalog is None:
        return 2
    try:
        token = settings.agent_secret(create=True)
    except ValueError as exc:
        print(f"joulegate agent: {exc}", file=sys.stderr)
        return 2
    if token is None and not is_loopback(args.host):
        print(f"joulegate agent: refusing to serve {args.host} without a token: a client "
              "that reaches the agent could move joules between requests. Set "
              "JOULEGATE_AGENT_TOKEN (or JOULEGATE_AGENT_TOKEN_FILE; created when missing) "
              "here and on the gateways.", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper())
    wanted = [d for d in catalog.devices if not args.host_name or d.host == args.host_name]
    try:
        server, samplers, devices = _start_agent(wanted, settings.sample_hz, args.host,
                                                 args.port, token=token,
                                                 quiet_hz=settings.sample_hz_quiet)
    except RuntimeError as exc:
        print(f"joulegate agent: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    for name, d in devices.items():
        print(f"agent: {name} metered by {d.reader.source} ({d.reader.name})", flush=True)
    print(f"agent: http://{args.host}:{args.port} (window calls "
          f"{'need the token' if token else 'open to this machine: no token'})", flush=True)
    stop.wait()
    server.shutdown()
    for s in samplers:
        s.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="joulegate", description="Energy-aware LLM gateway")
    sub = ap.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--models", help="models.yaml path (default JOULEGATE_MODELS_FILE)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=_port)
    serve.add_argument("--workers", type=int, default=1,
                       help="gateway processes (>1: energy metered by an agent)")
    serve.add_argument("--allow-unauthenticated", action="store_true",
                       help="serve a non-loopback address with no API key")
    serve.set_defaults(func=_serve)
    keys = sub.add_parser("keys", help="API keys (stored hashed in JOULEGATE_STATE_DIR)")
    keys.add_argument("action", choices=["create", "list", "revoke", "update"])
    keys.add_argument("--name", help="the key's name (create, revoke, update)")
    keys.add_argument("--rpm", type=_rate, help="requests per minute")
    keys.add_argument("--tpm", type=_rate, help="tokens (prompt + completion) per minute")
    keys.add_argument("--models", help="comma-separated model names it may use")
    keys.add_argument("--joule-budget", type=_joules, help="net joules per budget period")
    keys.add_argument("--budget-period", choices=["day", "week", "month"])
    keys.set_defaults(func=_keys)
    usage = sub.add_parser("usage", help="requests, tokens and joules from the usage ledger")
    usage.add_argument("--since", default="7d")
    usage.add_argument("--key", help="only this key's (by name)")
    usage.set_defaults(func=_usage)
    report = sub.add_parser("report", help="energy by kind of request: joules per token, "
                            "the divergence from token counts, loop stops")
    report.add_argument("--since", default="24h")
    report.add_argument("--models", help="models.yaml path (its backends' curves predict)")
    report.add_argument("--reference", help="the category multipliers are against "
                        "(default: the one with most requests)")
    report.add_argument("--json", action="store_true", help="the whole report as JSON")
    report.add_argument("--plot", help="also draw it into this PNG")
    report.add_argument("--gateway", help="a live gateway's report (URL; with its devices' "
                        "tail energy) instead of reading the usage database")
    report.add_argument("--key", help="the admin key for --gateway (default: "
                        "JOULEGATE_API_KEY)")
    report.set_defaults(func=_report)
    agent = sub.add_parser("agent", help="meter the GPUs of this host for remote gateways")
    agent.add_argument("--models", help="models.yaml path (its devices are metered)")
    agent.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (not loopback: a token is required)")
    agent.add_argument("--port", type=_port, default=9400)
    agent.add_argument("--host-name", help="meter only devices whose `host` is this")
    agent.set_defaults(func=_agent)
    add_tool_commands(sub, _catalog)
    args = ap.parse_args(argv)
    try:
        result: int = args.func(args)
    except ValidationError as exc:  # the settings (JOULEGATE_*): one line per field
        for err in exc.errors():
            field = "_".join(str(p) for p in err["loc"]).upper()
            print(f"joulegate: JOULEGATE_{field}: {err['msg']} (got {err.get('input')!r})",
                  file=sys.stderr)
        return 2
    return result


def _bounded(kind: type[int] | type[float], lo: float, hi: float, what: str
             ) -> Callable[[str], float]:
    """An argparse type: a finite number of `kind` in [lo, hi]."""
    import math

    def parse(text: str) -> float:
        try:
            n = kind(text)
        except ValueError:
            n = None
        if n is None or not math.isfinite(n) or not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return n
    return parse


_rate = _bounded(int, 1, 2**53, "a whole number from 1 to 2**53")
_joules = _bounded(float, 1e-9, float("inf"), "a positive number of joules")
_port = _bounded(int, 1, 65535, "a port (1-65535)")


if __name__ == "__main__":
    sys.exit(main())
