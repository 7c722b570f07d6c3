"""bench/results/README.md, written from the result files: each file, the
command that writes it, the commit it ran at (read from the file, or from
the JSON beside a PNG), what it shows and what supersedes it.

    python -m bench.index          # rewrite bench/results/README.md
    python -m bench.index --check  # exit 1 if it is out of date (make test)

A result file that is not in CATALOGUE, or an entry without its file, is an
error: a new benchmark adds its line here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

AB = "python -m bench.ab --base {base}"
# file -> (command, what it shows, superseded by or "")
CATALOGUE: dict[str, tuple[str, str, str]] = {
    "ab-agent-batches-w2-c50.json": (AB + " --workers 2 --connections 50",
                                     "agent calls sent in batches, two processes", ""),
    "ab-agent-results-w2-c50.json": (AB + " --workers 2 --connections 50",
                                     "one `results` call per device and poll", ""),
    "ab-agent-calls-layout.json": ("python -m bench.agent_calls --rounds 1, in each tree in "
                                   "turns", "the agent after issue 23's layout, against "
                                   "d37bf4d", ""),
    "ab-layout-auto-c50.json": (AB + " --model auto --connections 50 --rounds 3",
                                "issue 23's layout against d37bf4d, auto", ""),
    "ab-layout-c1.json": (AB + " --rounds 4", "issue 23's layout against d37bf4d, forced tier",
                          ""),
    "ab-layout-c50.json": (AB + " --connections 50 --rounds 3",
                           "issue 23's layout against d37bf4d, forced tier at c=50", ""),
    "ab-agent-unix-socket-w2-c50.json": (AB + " --workers 2 --connections 50",
                                         "the agent on a Unix socket under serve --workers", ""),
    "ab-decide-cuts-auto-c50.json": (AB + " --model auto --rounds 4 --seconds 6 "
                                     "--connections 50", "the decision's hand features and "
                                     "qualities in plain Python, auto at c=50", ""),
    "ab-finals-per-end-c1.json": (AB + " --rounds 8 --seconds 5 --connections 1",
                                  "final figures given two per ending request (after its "
                                  "response) instead of in chunks mid-request: c=1 p99 "
                                  "lower in 8 of 8 rounds", ""),
    "ab-finals-per-end-c50.json": (AB + " --rounds 4 --seconds 6 --connections 50",
                                   "the same at c=50: 3 of 4 rounds lower", ""),
    "ab-finals-per-end-c50-repeat.json": (AB + " --rounds 6 --seconds 6 --connections 50",
                                          "the same at c=50 again: no difference (3 rounds "
                                          "each way)", ""),
    "ab-agent-settle-w2-c1.json": (AB + " --workers 2 --rounds 6 --seconds 5 "
                                   "--connections 1", "the agent settling its quiet steps "
                                   "between exchanges (tried, not kept: no gain)", ""),
    "ab-settle-at-ends-c1.json": (AB + " --rounds 8 --seconds 5 --connections 1",
                                  "a quiet counter step settled by the event loop as the next "
                                  "request ends, not on the sampler thread mid-request", ""),
    "ab-settle-at-ends-c50.json": (AB + " --rounds 6 --seconds 6 --connections 50",
                                   "the same at c=50 (not quiet: settled on the sampler "
                                   "thread as before)", ""),
    "ab-kernel-reads-c1.json": (AB + " --rounds 6 --seconds 6 --connections 1",
                                "the CPU estimate's /proc/stat kept open (one pread a "
                                "reading), forced tier at c=1", ""),
    "ab-ledger-steps-c50.json": (AB + " --rounds 4 --seconds 6 --connections 50",
                                 "the ledger's cheaper counter steps (46b41a3) against "
                                 "72a91ce, forced tier at c=50", ""),
    "ab-direct-c50.json": (AB + " --connections 50", "the direct ASGI path for generation", ""),
    "ab-end-after-response-c1.json": (AB, "bookkeeping after the response is written", ""),
    "ab-mypyc-c50.json": ("python -m bench.ab --base be9b58d --connections 50 --rounds 3 "
                          "--seconds 6, run from a copy with 31 modules compiled by mypyc",
                          "the request path compiled by mypyc: not faster (1,163 -> 1,114 "
                          "req/s), not kept", ""),
    "ab-gc-thresholds-c50.json": (AB + " --connections 50", "gc.freeze and GC thresholds", ""),
    "ab-switch-interval-c1.json": (AB + " --rounds 4", "the GIL switch interval at 0.5 ms: p99 "
                                   "not lower, reverted", ""),
    "ab-give-index-c50.json": (AB + " --rounds 3 --connections 50", "give_spread by index "
                               "instead of slices: not faster, reverted", ""),
    "ab-sliced-settle-c1.json": (AB + " --rounds 4", "the ledger settling a counter step in "
                                 "slices of 16 windows, a 50 us sleep between: p99 at c=1", ""),
    "ab-sliced-settle-yield-c1.json": (AB + " --rounds 4", "the same with sched_yield between "
                                       "slices of 32: p99 not lower", ""),
    "ab-sliced-settle-auto-c50.json": (AB + " --rounds 3 --connections 50 --model auto",
                                       "settling in slices (and qualities by numpy): auto at "
                                       "c=50 -10% req/s, reverted", ""),
    "ab-sliced-settle-gated-c1.json": (AB + " --rounds 4", "settling in slices with pauses "
                                       "only while at most 4 requests run: c=1 p99 not lower, "
                                       "-10% req/s; not kept", ""),
    "ab-switch-c1.json": (AB + " --rounds 4 --seconds 8 --connections 1",
                          "the interpreter's switch interval 0.5 ms instead of 5 ms: c=1 p99 "
                          "2.21 -> 2.07 ms (medians)", ""),
    "ab-switch-c1b.json": (AB + " --rounds 6 --seconds 8 --connections 1",
                           "the same again: p99 1.99 vs 1.97 ms, no change; not kept", ""),
    "ab-switch-c50.json": (AB + " --rounds 4 --seconds 8 --connections 50",
                           "the same at c=50: 2,566 vs 2,574 req/s, no change", ""),
    "ab-settle-on-loop-c1.json": (AB + " --rounds 4 --seconds 8 --connections 1",
                                  "each reading handed to the event loop to settle there: "
                                  "c=1 p99 3.23 -> 3.42 ms, CPU 0.83 -> 0.92 ms; not kept", ""),
    "ab-mypyc-auto-c50.json": (AB + " --rounds 3 --seconds 6 --connections 50 --model auto, "
                               "run from a worktree with the pure modules compiled by mypyc",
                               "mypyc-compiled router, meter, ledger and SSE modules: router "
                               "decision 124 -> 61 us alone, no req/s change in the gateway "
                               "(993 vs 977 medians), not kept", ""),
    "ab-qualities-numpy-auto-c50.json": (AB + " --rounds 3 --connections 50 --model auto",
                                         "the router's per-action qualities as one numpy "
                                         "product: -4% req/s, not kept", ""),
    "ab-quiet-sampling-c1.json": (AB + " --rounds 4 --seconds 6", "the sampler at 100 Hz "
                                  "while at most 4 requests run and it wakes on time: p99 at "
                                  "c=1 1.97 -> 1.38 ms, every round", ""),
    "ab-quiet-sampling-c50.json": (AB + " --rounds 4 --seconds 6 --connections 50",
                                   "the same at c=50, forced tier (the sampler reads at 20 Hz "
                                   "there either way): 2,309 -> 2,109 req/s, 3 rounds of 4 "
                                   "lower; an A/B of the same change before its commit: 2,152 "
                                   "-> 2,164", ""),
    "ab-quiet-sampling-auto-c50.json": (AB + " --rounds 4 --seconds 6 --connections 50 "
                                        "--model auto", "the same with auto at c=50: 1,351 -> "
                                        "1,345 req/s", ""),
    "ab-spread-finals-c1.json": (AB + " --rounds 4", "final figures given 4 per turn of the "
                                 "loop: p99 at c=1", ""),
    "ab-spread-finals-c50.json": (AB + " --rounds 3 --connections 50", "final figures given 4 "
                                  "per turn of the loop: throughput at c=50", ""),
    "ab-guard-c1.json": (AB + " --rounds 4", "the request guard (Host, %2F, header limits) and "
                         "later commits against 078ad59", ""),
    "ab-same-code-c1.json": (AB + " --rounds 4", "A/A: the same commit on both sides, this "
                             "VM's bias between the sides (this side ~0.04 ms dearer)", ""),
    "ab-head-deadline-c1.json": (AB + " --rounds 4", "the head deadline protocol, agent "
                                 "token and fair-share commits against 0c43ea8", ""),
    "ab-agent-token-w2-c50.json": (AB + " --workers 2 --connections 50",
                                   "agent token and window owners (serve --workers) against "
                                   "0c43ea8", ""),
    "ab-http1-c50.json": (AB + " --connections 50", "the own HTTP/1.1 client against httpx", ""),
    "ab-lazy-explain-auto-c50.json": (AB + " --model auto --connections 50",
                                      "decisions explained only for /v1/route", ""),
    "ab-named-windows-w2-c1.json": (AB + " --workers 2", "windows named by the gateway", ""),
    "ab-named-windows-w2-c50.json": (AB + " --workers 2 --connections 50",
                                     "windows named by the gateway", ""),
    "ab-no-metering-c50.json": (AB + " --connections 50 --rounds 3, the working tree's "
                                "LocalMeter.open patched to return None",
                                "diagnostic: per-request metering's cost at c=50 (0.434 -> "
                                "0.325 ms CPU per request, +32% req/s without it)", ""),
    "ab-ledger-provisional-c1.json": (AB + " --base c4bb70c --rounds 6 --seconds 6 (at "
                                      "cd11aa0: the ledger's provisional-figure fixes of "
                                      "this stop)",
                                      "no cost at one connection: 0.744 -> 0.740 ms CPU a "
                                      "request, 1,323 -> 1,330 req/s, p99 2.72 -> 2.74 ms",
                                      ""),
    "ab-note-work-c50.json": (AB + " --base 8f9eeb4 --connections 50 --rounds 3 --seconds 6 "
                              "(the ledger weighing a closing request's share by the newest "
                              "span's work, read at each counter change)",
                              "0.599 -> 0.602 ms CPU per request, 1,710 -> 1,697 req/s: within "
                              "the noise (p99 111 -> 142 ms in the medians; the base's rounds "
                              "109-200)", ""),
    "ab-no-metering-c1.json": (AB + " --rounds 4, the same patch",
                               "diagnostic: per-request metering's cost at c=1 (p99 2.59 -> "
                               "1.94 ms without it)", ""),
    "ab-no-assessment-auto-c50.json": (AB + " --model auto --connections 50 --rounds 3, the "
                                       "working tree's Router.decide reusing the first "
                                       "assessment of each text (reverted)",
                                       "diagnostic: the router's assessment's cost under "
                                       "auto at c=50 (0.691 -> 0.472 ms CPU per request, "
                                       "1,483 -> 2,181 req/s without it)", ""),
    "ab-overhead.json": (AB, "the default A/B output (forced tier, one connection)", ""),
    "ab-request-path-cuts-auto-c50.json": (AB + " --model auto --connections 50",
                                           "request-path cuts, auto", ""),
    "ab-request-path-cuts-c1.json": (AB, "request-path cuts, forced tier", ""),
    "ab-request-path-cuts-w2-c50.json": (AB + " --workers 2 --connections 50",
                                         "request-path cuts, two processes", ""),
    "ab-reuseport-w2-c50.json": (AB + " --workers 2 --connections 50",
                                 "a listening socket per process (SO_REUSEPORT)", ""),
    "ab-router-and-inserts-auto-c50.json": (AB + " --model auto --connections 50",
                                            "router cuts and multi-row usage inserts", ""),
    "ab-settle-gc-c50.json": (AB + " --connections 50", "ledger settling and GC", ""),
    "ab-small-cuts-c50.json": (AB + " --connections 50", "small request-path cuts", ""),
    "ab-stream-watch-c50.json": (AB + " --stream --connections 50",
                                 "streams watched without a task group", ""),
    "ab-usage-insert-c50.json": (AB + " --connections 50", "usage rows, many per INSERT", ""),
    "ab-since-8d321ac-c50.json": (AB + " --connections 50 --rounds 3 --seconds 6",
                                  "whether the code got slower since the gateways run before "
                                  "(forced tier, c=50): 1,730 -> 1,912 req/s, no", ""),
    "ab-since-8d321ac-auto-c1.json": (AB + " --model auto --rounds 4 --seconds 5",
                                      "the same for `auto` at c=1: p99 2.23 -> 2.30 ms, "
                                      "within its rounds", ""),
    "ab-usage-journal-c1.json": (AB + " --rounds 4",
                                 "the usage journal and what came with it, against 61fcd7e",
                                 ""),
    "ab-thinking-session-auto-c50.json": (AB + " --model auto --connections 50",
                                          "stop 36's changes (thinking budgets, report, "
                                          "inline tags) against c0d1eb1, auto", ""),
    "ab-thinking-session-c50.json": (AB + " --connections 50",
                                     "the same, forced tier", ""),
    "ab-usage-journal-c50.json": (AB + " --rounds 4 --connections 50",
                                  "the same at 50 connections", ""),
    "ab-usage-journal-only-c50.json": (AB + " --connections 50",
                                       "the journal alone: base is this code with the journal "
                                       "off (a35fbd7, a throwaway commit not on main)", ""),
    "agent-calls.json": ("python -m bench.agent_calls --rounds 3",
                         "agent CPU per exchange: own server (asyncio, uvloop) vs uvicorn + "
                         "Starlette", ""),
    "attribution-model.json": ("python -m bench.attribution_model",
                               "attribution of a batch's energy, simulated on H200 curves", ""),
    "auth-latency.json": ("python -m bench.auth_latency",
                          "the key, budget and rate check with 1,000 keys", ""),
    "classifier-embedding.json": ("python -m bench.embedding_classifier (a venv with torch)",
                                  "MiniLM embeddings against the shipped classifier", ""),
    "cpu-curves.png": ("joulegate curves plot curves/cpu/*.json --out ...",
                       "the CPU test workers' operating curves", ""),
    "dashboard-energy-panels.png": ("pytest tests/integration/test_dashboards.py",
                                    "Grafana's energy panels over a minute of traffic", ""),
    "database-ops.json": ("python -m bench.database_ops --base d37bf4d --postgres ...",
                          "SQLAlchemy Core against the hand-written SQL layer", ""),
    "gateways-h200-host-run6.json": ("bash bench/run_gateways_device.sh (device tool)",
                                     "gateways side by side, GPU host run 6",
                                     "gateways-h200-host-run8.json (kept: the runs table)"),
    "gateways-h200-host-run6.png": ("same", "run 6 as a picture", "run 8"),
    "gateways-h200-host-run7.json": ("bash bench/run_gateways_device.sh (device tool)",
                                     "gateways side by side, GPU host run 7",
                                     "gateways-h200-host-run8.json (kept: the runs table)"),
    "gateways-h200-host-run7.png": ("same", "run 7 as a picture", "run 8"),
    "gateways-h200-host-run8.json": ("bash bench/run_gateways_device.sh (device tool)",
                                     "gateways side by side on the GPU host's 16 cores", ""),
    "gateways-h200-host-run8.png": ("same", "run 8 as a picture", ""),
    "gateways-h100-host-run9.json": ("SECONDS_EACH=3 bash bench/run_gateways_device.sh "
                                     "(device tool; an H100 host)",
                                     "gateways side by side on the GPU host's pinned cores, "
                                     "with the bare pass-through: 3 rounds in turns", ""),
    "gateways-h100-host-run9.png": ("same", "run 9 as a picture", ""),
    "gateways-h100-host-run10.json": ("bash bench/run_gateways_device.sh "
                                      "(device tool; an H100 host, 9d7893d)",
                                      "gateways side by side on the GPU host's pinned cores, "
                                      "with the bare pass-through: 3 rounds in turns; forced "
                                      "c=1 p99 3.17x, c=50 0.64x", ""),
    "gateways-h100-host-run10.png": ("same", "run 10 as a picture", ""),
    "gateways-h100-host-run11.json": ("bash bench/run_gateways_device.sh "
                                      "(device tool; an H100 host, ba6f673)",
                                      "gateways side by side on the GPU host's pinned cores, "
                                      "with the bare pass-through: 3 rounds in turns; forced "
                                      "c=1 p99 2.42x, c=50 0.58x; auto 3.06x / 0.41x", ""),
    "gateways-h100-host-run11.png": ("same", "run 11 as a picture", ""),
    "gateways-h100-host-run12.json": ("bash bench/run_gateways_device.sh "
                                      "(device tool; an H100 host, c8dc6ec)",
                                      "gateways side by side on the GPU host's pinned cores, "
                                      "with the bare pass-through: 3 rounds in turns; forced "
                                      "c=1 p99 2.29x (a round at 1.19x), c=50 0.74x; auto "
                                      "2.39x / 0.43x", ""),
    "gateways-h100-host-run12.png": ("same", "run 12 as a picture", ""),
    "gateways-h100-host-run13.json": ("bash bench/run_gateways_device.sh "
                                      "(device tool; an H100 host, da11007)",
                                      "gateways side by side with the bare pass-through, 3 "
                                      "rounds in turns, on a host that did not enforce the "
                                      "pins; forced c=1 p99 2.04x, c=50 0.79x; auto 2.74x / "
                                      "0.46x; streamed forced 1.52x / 1.08x", ""),
    "gateways-h100-host-run13.png": ("same", "run 13 as a picture", ""),
    "tail-parts-h100-host.json": ("python -m bench.tail_parts (device tool, an H100 host; run "
                                  "by the script the tool was made from)",
                                  "the c=1 tail part by part, pinned, 3 rounds in turns: p99 "
                                  "2.22x the pass-through's as is, 1.58x without the records, "
                                  "0.97x without them and the sampler thread", ""),
    "cprofile-small-c50.json": ("python -m bench.cprofile_gateway --model small",
                                "a forced request's time in the loaded event loop by stage "
                                "and function (cProfile, shares)", ""),
    "cprofile-auto-c50.json": ("python -m bench.cprofile_gateway --model auto",
                               "the same under auto", ""),
    "gateways.json": ("python -m bench.gateways --seconds 8 --rounds 3",
                      "nginx, a bare FastAPI pass-through (1 and 2 processes), joulegate (also "
                      "metered by a `joulegate agent` process) and LiteLLM side by side on "
                      "this VM", ""),
    "gateways.png": ("same", "gateways.json as a picture", ""),
    "gpu-routing-long-documents-c8-split-prompt-h100.json": (
        "JOULEGATE_COMMIT=20658a3 SPLIT=1 SECOND=prompt CONCURRENCY=8 N=50 "
        "WORKLOADS=\"long-documents chat-traffic\" bash bench/run_h200.sh (device tool, an H100)",
        "long documents at eight clients: always-large, auto (margin), the load-blind split and "
        "auto-prompt (the pricing by prompt length) in turns (nvml)", ""),
    "gpu-routing-chat-traffic-c8-split-prompt-h100.json": (
        "same", "chat-traffic at eight clients, the same turns (nvml)", ""),
    "gpu-routing-chat-traffic-c4-split-prompt-h100.json": (
        "JOULEGATE_COMMIT=506d4cf SPLIT=1 CONCURRENCY=4 N=100 WORKLOADS=chat-traffic bash "
        "bench/run_h200.sh (device tool, an H100)",
        "chat-traffic at four clients: always-large, auto (the pricing by prompt length), the "
        "load-blind split and auto-share in turns, 100 prompts a turn (nvml)", ""),
    "gpu-routing-long-documents-c4-split-prompt-h100.json": (
        "JOULEGATE_COMMIT=506d4cf SPLIT=1 SECOND=margin CONCURRENCY=4 N=50 "
        "WORKLOADS=long-documents bash bench/run_h200.sh (device tool, an H100)",
        "long documents at four clients: always-large, auto (the pricing by prompt length), "
        "the load-blind split and auto-margin in turns, 50 prompts a turn (nvml)", ""),
    "gpu-mixed-h100.json": ("JOULEGATE_COMMIT=c611689 bash bench/run_h200_mixed.sh (device "
                            "tool, an H100)",
                            "one GPU under mixed load: closed loops of 0-8 clients on the 1B "
                            "and the 8B at once, short and long prompts, joules per request "
                            "against the (H200) curves' prediction (nvml)", ""),
    "gpu-mixed-h100.png": ("same", "gpu-mixed-h100.json as a picture", ""),
    "gpu-loops-chat-traffic-direct-h100.json": (
        "JOULEGATE_COMMIT=56b84df PROMPTS=chat-traffic GRID=\"0:8,0:1,0:2,0:3,0:4,0:6,0:8,4:0,"
        "8:0\" NAME=gpu-loops-chat-traffic-direct bash bench/run_h200_mixed.sh (device tool, "
        "an H100)",
        "closed loops of 1-8 clients on the 8B (and 4, 8 on the 1B) with the replays' "
        "chat-traffic prompts, to the workers directly: joules and seconds per request (nvml)",
        ""),
    "gpu-loops-chat-traffic-direct-h100.png": ("same", "the direct loops as a picture", ""),
    "gpu-loops-chat-traffic-gateway-h100.json": (
        "the same call, then VIA_GATEWAY=1 NAME=gpu-loops-chat-traffic-gateway",
        "the same loops through a joulegate gateway (forced tiers) on the same workers (nvml)",
        ""),
    "gpu-loops-chat-traffic-gateway-h100.png": ("same", "the gateway loops as a picture", ""),
    "gpu-loops-prompts-h100.json": (
        "JOULEGATE_COMMIT=27e7d8c PROMPTS=fixed,chat-traffic GRID=\"0:8,0:1,0:2,0:3,0:4,0:6,"
        "0:8\" NAME=gpu-loops-prompts bash bench/run_h200_mixed.sh (device tool, an H100)",
        "closed loops of 1-8 clients on the 8B with the fixed short and long prompts and "
        "chat-traffic in turn on one set of workers: the bump at 3-4 clients is the host's, "
        "not the prompts' (nvml)", ""),
    "gpu-loops-prompts-h100.png": ("same", "the three prompt sets' loops as a picture", ""),
    "gpu-routing-chat-traffic-c4-split-profile-own-count-h100.json": (
        "JOULEGATE_COMMIT=27e7d8c PROFILE_FROM=bench/results/gpu-loops-prompts-h100.json "
        "SPLIT=1 SECOND=prompt CONCURRENCY=4 N=100 WORKLOADS=chat-traffic bash "
        "bench/run_h200.sh (device tool, an H100)",
        "chat-traffic at four clients: always-large, auto with the fixed prompt's batch "
        "profile on the 8B (a join priced at the 8B's own count), the split and auto without "
        "the profile, in turns (nvml)",
        "gpu-routing-chat-traffic-c4-split-profile-h100.json"),
    "gpu-routing-chat-traffic-c8-split-profile-own-count-h100.json": (
        "the same with CONCURRENCY=8", "the same turns at eight clients: the profile lost 23%",
        "gpu-routing-chat-traffic-c8-split-profile-h100.json"),
    "gpu-routing-chat-traffic-c4-split-profile-h100.json": (
        "JOULEGATE_COMMIT=09ab69c PROFILE_FROM=bench/results/gpu-loops-prompts-h100.json "
        "SPLIT=1 SECOND=prompt CONCURRENCY=4 N=100 WORKLOADS=chat-traffic bash "
        "bench/run_h200.sh (device tool, an H100)",
        "the same A/B with a join priced at what the device has in flight: -27% at four "
        "clients (nvml)", ""),
    "gpu-routing-chat-traffic-c8-split-profile-h100.json": (
        "the same with CONCURRENCY=8", "the same at eight clients: +10.5% on always-large, so "
        "no shipped curve carries a profile (nvml)", ""),
    "gpu-routing-chat-traffic-c2-split-profile-varied-h100.json": (
        "JOULEGATE_COMMIT=37d8f4d PROFILE_FROM=bench/results/gpu-loops-prompts-h100.json "
        "SPLIT=1 SECOND=prompt ANSWERS=varied CONCURRENCY=2 N=80 WORKLOADS=chat-traffic bash "
        "bench/run_h200.sh (device tool, an H100)",
        "the profile A/B with answer lengths drawn per request, two clients: auto with the "
        "profile 3.3% less than always-large, without 2.1%, the load-blind split 46% (nvml)",
        ""),
    "gpu-routing-chat-traffic-c4-split-profile-varied-h100.json": (
        "the same with CONCURRENCY=4 N=100",
        "four clients, varied answers: auto with the profile 32% less than always-large, "
        "without 8.7% (nvml)", ""),
    "gpu-routing-chat-traffic-c8-split-profile-varied-h100.json": (
        "the same with CONCURRENCY=8 N=100",
        "eight clients, varied answers: auto with the profile 0.9% more than always-large "
        "(its two turns 3.5% apart), the split 42.5% more (nvml)", ""),
    "gpu-curves-profile-h100.json": (
        "python3 bench/gpu_routing.py --phase calibrate --concurrency 1,2,4,8 --prompts "
        "64,512,4096 --completions 32,256,1024 at 37d8f4d (device tool, an H100; "
        "-> curves/h100/)",
        "this H100's curves with their batch profile: x1.80 (8B) and x1.89 (1B) at four "
        "clients, x0.99 at two (nvml)", ""),
    "gpu-curves-profile-h100.png": ("same", "the H100 curves as a picture", ""),
    "gpu-routing-chat-traffic-c4-split-varied-own-curves-h100.json": (
        "right after it, on the same machine: JOULEGATE_COMMIT=37d8f4d SPLIT=1 SECOND=prompt "
        "ANSWERS=varied CONCURRENCY=4 N=60 WORKLOADS=chat-traffic bash bench/run_h200.sh",
        "auto priced by the curves this H100 just calibrated (curves/h100, with their "
        "profile) at four clients: 35.7% less than always-large, as the split (nvml)", ""),
    "gpu-routing-chat-traffic-c8-split-varied-own-curves-h100.json": (
        "JOULEGATE_COMMIT=da526e0 CURVES=h100 SPLIT=1 ANSWERS=varied CONCURRENCY=8 N=100 "
        "WORKLOADS=chat-traffic bash bench/run_h200.sh (device tool, an H100)",
        "auto priced by curves/h100 (with their profile) at eight clients: 2.8% less than "
        "always-large (4 of 200 small); the split 54% more, share 71% more (nvml)", ""),
    "gpu-routing-chat-traffic-c2-split-varied-own-curves-h100.json": (
        "right after it, on the same machine: the same with CONCURRENCY=2 N=80",
        "the same at two clients: auto 4.0% less than always-large (2 of 160 small), the "
        "split 46.9% and share 46.2% less at 96% of its expected quality (nvml)", ""),
    "gpu-routing-chat-traffic-c2-split-varied-pairs-h100.json": (
        "JOULEGATE_COMMIT=53047e9 CURVES=h100 SPLIT=1 SECOND=pairs ANSWERS=varied "
        "CONCURRENCY=2 N=80 WORKLOADS=chat-traffic bash bench/run_h200.sh (device tool, "
        "an H100)",
        "two clients: auto with a pair priced at its share (routing.share_at_most_in_flight) "
        "46.0% less than always-large, without 6.6%, the split 45.9% (nvml)", ""),
    "gpu-routing-chat-traffic-c4-split-varied-pairs-h100.json": (
        "right after it, on the same machine: the same with CONCURRENCY=4 N=80",
        "four clients: with pairs at their share 31.8% less than always-large, without "
        "28.5%, the split 26.8% (nvml)", ""),
    "gpu-routing-chat-traffic-c8-split-varied-pairs-h100.json": (
        "on the same machine: the same with CONCURRENCY=8 N=100",
        "eight clients: with pairs at their share 1.6% less than always-large, without "
        "0.9% more, the split 41.9% more (nvml)", ""),
    "gpu-routing-benchmark-mix-c2-split-varied-pairs-heldout-h100.json": (
        "JOULEGATE_COMMIT=745e9c5 CURVES=h100 SPLIT=1 SECOND=prompt ANSWERS=varied "
        "CONCURRENCY=2 N=80 WORKLOADS=benchmark-mix bash bench/run_h200.sh (device tool, "
        "an H100)",
        "the pair rule on a workload it was not chosen on, two clients: auto (the rule, "
        "default) 54.0% less than always-large, auto-prompt (without) 3.3% more, the split "
        "51.9% less; expected quality kept 94.7% / 99.9% (nvml)", ""),
    "gpu-routing-benchmark-mix-c4-split-varied-pairs-heldout-h100.json": (
        "right after it, on the same machine: the same with CONCURRENCY=4",
        "four clients: with the rule 42.6% less than always-large, without 47.5% (one "
        "turn), the split 39.3% (nvml)", ""),
    "gpu-routing-benchmark-mix-c8-split-varied-pairs-heldout-h100.json": (
        "on the same machine: the same with CONCURRENCY=8 N=100",
        "eight clients: with the rule 3.0% more than always-large, without 1.5% less (one "
        "turn), the split 43.7% more (nvml)", ""),
    "gpu-routing-benchmark-mix-c2-split-varied-fulltol-h100.json": (
        "JOULEGATE_COMMIT=dad6421 CURVES=h100 SPLIT=1 SECOND=fulltol ANSWERS=varied "
        "CONCURRENCY=2 N=80 WORKLOADS=benchmark-mix bash bench/run_h200.sh (device tool, "
        "an H100)",
        "hard requests keep their best (routing.full_tolerance_from 0.7) against the "
        "tolerance in full, two clients: 46.4% / 55.2% less than always-large (one turn of "
        "the second) at 95.8% / 94.7% of its expected quality (nvml)", ""),
    "gpu-routing-long-documents-c2-split-varied-pairs-heldout-h100.json": (
        "on the same machine: CONCURRENCY=2 N=60 WORKLOADS=long-documents",
        "long prompts, two clients: with the rule 58.5% less than always-large, without "
        "60.8% (one turn), the split 58.9% (nvml)", ""),
    "gpu-curves.json": ("python -m bench.gpu_routing --phase calibrate (device tool)",
                        "H200 operating curves, leave-one-out error (nvml)", ""),
    "gpu-curves.png": ("same", "the H200 curves as a picture", ""),
    "gpu-routing-marginal.json": ("python -m bench.gpu_routing (device tool)",
                                  "auto against always-large at c=8, marginal pricing (nvml)",
                                  ""),
    "gpu-routing-marginal.png": ("same", "gpu-routing-marginal.json as a picture", ""),
    "gpu-routing-benchmark-mix.json": ("python -m bench.gpu_routing --workload benchmark-mix "
                                       "(device tool)", "auto against always-large and "
                                       "small+CoT on the benchmark mix, c=1 and c=8 (nvml)", ""),
    "gpu-routing-benchmark-mix.png": ("same", "gpu-routing-benchmark-mix.json as a picture", ""),
    "gpu-routing-chat-traffic.json": ("python -m bench.gpu_routing --workload chat-traffic "
                                      "(device tool)", "auto against always-large and "
                                      "small+CoT on the chat-traffic workload, c=1 and c=8 "
                                      "(nvml)", ""),
    "gpu-routing-chat-traffic.png": ("same", "gpu-routing-chat-traffic.json as a picture", ""),
    "gpu-routing-chat-traffic-h100.json": ("PHASES=replay WORKLOADS=chat-traffic bash "
                                           "bench/run_h200.sh (device tool, an H100)",
                                           "the chat-traffic replay on an H100 with the "
                                           "router as shipped (held-out workload), priced "
                                           "by the H200 curves, c=1 and c=8 (nvml)", ""),
    "gpu-routing-chat-traffic-h100.png": ("same", "gpu-routing-chat-traffic-h100.json as a "
                                          "picture", ""),
    "gpu-routing-benchmark-mix-h100.json": ("PHASES=replay WORKLOADS=benchmark-mix bash "
                                            "bench/run_h200.sh (device tool, an H100)",
                                            "the benchmark-mix replay on an H100 with the "
                                            "router as shipped, c=1 and c=8 (nvml)",
                                            ""),
    "gpu-routing-benchmark-mix-h100.png": ("same", "gpu-routing-benchmark-mix-h100.json as a "
                                           "picture", ""),
    "gpu-routing-chat-traffic-c8-h100.json": ("WORKLOADS=chat-traffic CONCURRENCY=8 bash "
                                              "bench/run_h200.sh (device tool, an H100)",
                                              "the chat-traffic replay's c=8 turns alone at "
                                              "862eb23 with 26053f6's replay fix (its "
                                              "commit field: 862eb23+fix), with the arrival "
                                              "places of the requests auto sent small (nvml)", ""),
    "gpu-routing-benchmark-mix-c8-h100.json": ("WORKLOADS=benchmark-mix CONCURRENCY=8 bash "
                                               "bench/run_h200.sh (device tool, an H100)",
                                               "the benchmark-mix replay's c=8 turns alone at "
                                               "862eb23 with 26053f6's replay fix (its "
                                               "commit field: 862eb23+fix), with the arrival "
                                               "places of the requests auto sent small (nvml)", ""),
    "gpu-routing-chat-traffic-c4-h100.json": ("WORKLOADS=chat-traffic CONCURRENCY=4 bash "
                                              "bench/run_h200.sh (device tool, an H100)",
                                              "auto, always-large and small+CoT at four "
                                              "clients, in turns, at d491eb7, with the arrival "
                                              "places of the requests auto sent small (nvml)", ""),
    "gpu-routing-benchmark-mix-c4-h100.json": ("WORKLOADS=benchmark-mix CONCURRENCY=4 bash "
                                               "bench/run_h200.sh (device tool, an H100)",
                                               "the same at four clients for the benchmark "
                                               "mix, d491eb7 (nvml)", ""),
    "gpu-routing-chat-traffic-c4-split-h100.json": (
        "python3 bench/gpu_routing.py --phase replay --workload chat-traffic --concurrency 4 "
        "--split --n 100 ... (device tool, an H100; SPLIT=1 CONCURRENCY=4 bash "
        "bench/run_h200.sh runs it at n=200)",
        "is the router's load pricing right? always-large, `split` (each prompt to the action "
        "the router takes for it with nothing running, blind to load) and auto, in turns at "
        "four clients, e14f8ee (nvml)", ""),
    "gpu-routing-chat-traffic-c4-split-83b3f8e-h100.json": (
        "JOULEGATE_COMMIT=83b3f8e SPLIT=1 CONCURRENCY=4 N=100 WORKLOADS=chat-traffic bash "
        "bench/run_h200.sh (device tool, an H100)",
        "turns large, auto (share pricing, then the default), split, auto-margin, split, "
        "auto, large at four clients: share 33% less than always-large, margin 9%, split "
        "29% (nvml)", ""),
    "gpu-routing-chat-traffic-c8-split-h100.json": (
        "JOULEGATE_COMMIT=83b3f8e SPLIT=1 CONCURRENCY=8 N=100 WORKLOADS=chat-traffic bash "
        "bench/run_h200.sh (device tool, an H100)",
        "the same at eight clients: share 40% MORE than always-large, split 70% more, "
        "margin 8% less (nvml); why the default went back to margin", ""),
    "gpu-routing-long-documents-c8-split-h100.json": (
        "JOULEGATE_COMMIT=83b3f8e SPLIT=1 CONCURRENCY=8 N=100 WORKLOADS=long-documents bash "
        "bench/run_h200.sh (device tool, an H100)",
        "the same at eight clients for easy asks about long texts: share 50% less than "
        "always-large, split 51%, margin 6% (nvml)", ""),
    "gpu-routing.json": ("python -m bench.gpu_routing (device tool)",
                         "auto against always-large and small+CoT, c=1 and c=8 (nvml), the "
                         "router before open requests", "gpu-routing-benchmark-mix.json"),
    "gpu-routing.png": ("same", "gpu-routing.json as a picture", "gpu-routing-benchmark-mix.png"),
    "seed-shots-cpu-estimate.json": ("python -m bench.seed_shots --source estimate --n 40",
                                     "seed 003 on this CPU: HumanEval zero- vs three-shot "
                                     "with SmolLM2, energy (estimate), tokens, pass@1", ""),
    "gpu-thinking-curves.json": ("bash bench/run_h200_thinking.sh (device tool)",
                                 "H200 curves of the Qwen3-1.7B/8B shapes (nvml)", ""),
    "gpu-thinking-curves.png": ("same", "gpu-thinking-curves.json as a picture", ""),
    "gpu-thinking.json": ("bash bench/run_h200_thinking.sh (device tool)",
                          "thinking budgets per query: auto against always-large-thinking, "
                          "always-large-no-thinking and always-small-thinking on the "
                          "chat-traffic workload, c=1 and c=8 (nvml; quality expected)", ""),
    "gpu-thinking.png": ("same", "gpu-thinking.json as a picture", ""),
    "gpu-thinking-h100.json": ("bash bench/run_h200_thinking.sh (device tool, an H100)",
                               "the thinking replay with the router as shipped, "
                               "priced by the H200 curves: auto against "
                               "always-large-thinking, -no-thinking and small-thinking, "
                               "chat-traffic, c=1 and c=8 (nvml; quality expected)", ""),
    "gpu-thinking-h100.png": ("same", "gpu-thinking-h100.json as a picture", ""),
    "gpu-telemetry.json": ("python -m bench.gpu_telemetry (device tool)",
                           "per-request energy on the H200: conservation, attribution (nvml)",
                           ""),
    "gpu-telemetry-h100.json": ("PHASES=telemetry bash bench/run_h200.sh (device tool, an "
                                "H100, ba6f673)",
                                "per-request energy on an H100 with the meter on the counter's "
                                "beat: conservation 9e-16, a response's figure 3.9% / 2.7% "
                                "from its final one (median, alone / ten at once; 1.4% / 5.0% "
                                "at 9d7893d, 1.3% / 9.6% at c4bb70c); each request's counter "
                                "changes (nvml)", ""),
    "hostile.json": ("python -m bench.hostile",
                     "slowloris, agent spoofing and a 5,000-body mutation fuzz against a keyed "
                     "gateway with real workers and agent", ""),
    "load.json": ("python -m bench.load", "1,000 requests at once against CPU workers", ""),
    "placement-estimate.json": ("python -m bench.placement --threads 1 --requests 96 --tokens 64 "
                                "--bound 0.02",
                                "packed vs spread vs packed within a latency bound of 0.02 s "
                                "a token, two CPU replicas of tiny-large on this machine "
                                "(estimate); the H200 run is placement-nvml.json", ""),
    "placement-estimate.png": ("same", "J per request and p99 per token, packed vs spread vs "
                               "bounded", ""),
    "placement-nvml.json": ("bash bench/run_h200_session.sh (device tool; JOBS=placement)",
                            "packed vs spread on one H200: two replicas of the 8B shape, "
                            "64 requests of 256 tokens at c=8 and c=16 (nvml)", ""),
    "placement-nvml.png": ("same", "J per request and p99 per token, packed vs spread", ""),
    "seed-energy-by-kind.json": ("bash bench/run_h200_session.sh (device tool; "
                                 "JOBS=seed-energy): python -m bench.seed_energy --source nvml",
                                 "seed 000 with SmolLM2 on the H200: divergence per kind, "
                                 "predictions, loop stops, order tests A/B (nvml)", ""),
    "seed-energy-by-kind.png": ("python -m bench.seed_compare", "seed-energy-by-kind.json as "
                                "a picture", ""),
    "seed-shots-h200.json": ("bash bench/run_h200_session.sh (device tool; JOBS=seed-shots): "
                             "python -m bench.seed_shots --source nvml --n 40",
                             "seed 003 on the H200: HumanEval zero- vs three-shot with "
                             "SmolLM2 (nvml)", ""),
    "seed-shots-gpu-host-cpu-estimate.json": ("bash bench/run_h200_session.sh (device tool; "
                                              "JOBS=seed-shots-cpu)", "seed 003 on the GPU "
                                              "host's cores, 2 threads (estimate: no RAPL "
                                              "there)", ""),
    "seed-cpu-gpu-shots.json": ("python -m bench.seed_compare", "seed 003 side by side: "
                                "this CPU, the GPU host's CPU, the H200; identical greedy "
                                "answers between them", ""),
    "seed-cpu-gpu-shots.png": ("same", "energy, time and answer tokens per device and mode",
                               ""),
    "memory-before-compaction.json": ("python -m bench.memory",
                                      "RSS growth before the ledger compacted its windows",
                                      "memory.json"),
    "memory.json": ("python -m bench.memory", "RSS over 100,000 requests", ""),
    "ledger-cost.json": ("python -m bench.ledger_cost --base 72a91ce --rounds 6",
                         "the ledger's counter steps and closes per request, simulated, "
                         "CPU and instructions", ""),
    "aging-h100-host.json": ("python -m bench.aging --pin --rounds 3 --seconds 5 --load-s 20 "
                             "(device tool, an H100 host)",
                             "a lone gateway's CPU per request at c=1 as it serves 200,000 "
                             "requests, and afresh, in turns with the pass-through", ""),
    "aging-h100-host.png": ("same", "the same as a picture", ""),
    "aging-siblings-h100-host.json": ("python -m bench.aging --pin --siblings --rounds 3 "
                                      "--seconds 5 --load-s 15 (device tool, an H100 host)",
                                      "the same beside bench.gateways' 2- and 4-process "
                                      "gateways, loaded too", ""),
    "aging-siblings-h100-host.png": ("same", "the same as a picture", ""),
    "ledger-cost-aged.json": ("python -m bench.ledger_cost --base a819f4e --rounds 4",
                              "the same with a case past the 20,000 figures kept "
                              "(c1-aged): the oldest dropped from an OrderedDict",
                              ""),
    "startup.json": ("python -m bench.startup --base 1798e58 --rounds 5",
                     "a gateway process's start and memory, the classifier's arrays "
                     "against its pickle", ""),
    "decide-cost.json": ("python -m bench.decide_cost --base 1360b7e --rounds 6 --decisions 1000",
                         "one routing decision (six kinds of request) in CPU and "
                         "instructions, against a base", ""),
    "kernel-reads.json": ("python -m bench.kernel_reads",
                          "one reading of /proc/stat (and RAPL where readable): read_text "
                          "against a kept descriptor's pread", ""),
    "metric-updates.json": ("python -m bench.metric_updates",
                            "a request's metric updates, direct against batched", ""),
    "outages.json": ("python -m bench.outages",
                     "requests while the agent is killed and started again (statuses, p50 / "
                     "p99, the gateway's log lines about it), and a budget check while the "
                     "usage database refuses with 200,000 rows waiting", ""),
    "overhead.json": ("python -m bench.overhead",
                      "latency the gateway adds in front of a real worker (SmolLM2 on "
                      "llama-server, one token, one request at a time), from the client "
                      "and as x-joulegate-overhead-ms reports it", ""),
    "profile-auto-c50.json": ("python -m bench.profile_gateway --model auto --connections 50",
                              "py-spy profile of auto at c=50", ""),
    "profile-auto-c50-gil.json": ("python -m bench.profile_gateway --model auto "
                                  "--connections 50 --gil",
                                  "who holds the interpreter under auto at c=50: the "
                                  "router's decision 29% of the samples", ""),
    "profile-small-c1-gil.json": ("python -m bench.profile_gateway --connections 1 --gil",
                                  "who holds the interpreter at c=1: the event loop ~96%, "
                                  "the sampler and the usage writer ~2% each", ""),
    "tail-phase.json": ("python -m bench.tail_phase --rounds 3",
                        "c=1 from a raw-socket client, in turns with the pass-through: p99 "
                        "1.31x the pass-through's (median of rounds); a third of the slow "
                        "requests fall in one tenth of the sampler's 50 ms period", ""),
    "profile-small-c50-gil.json": ("python -m bench.profile_gateway --connections 50 --gil",
                                   "who holds the interpreter at c=50: the event loop ~96%, "
                                   "the sampler 2.2%, the usage writer 1.5%", ""),
    "profile-small-c50.json": ("python -m bench.profile_gateway --connections 50",
                               "py-spy profile of the forced tier at c=50", ""),
    "burst-routes-share.json": ("python -m bench.burst_routes --pricing share",
                                "auto's decisions with the H200 catalogue from a cold start "
                                "at c=1/2/4/8 (CPU workers, decisions only), the share "
                                "pricing (the default from 34a5aff to 83b3f8e): the "
                                "load-blind split's share small up to c=4, nearly all large "
                                "at c=8", ""),
    "burst-routes-share-long-documents.json": ("python -m bench.burst_routes --pricing share "
                                               "--workload long-documents",
                                               "the share pricing's decisions for easy asks "
                                               "about long texts: 43% of those answered "
                                               "small at c=8, beside a full 8B batch", ""),
    "burst-routes-margin-long-documents.json": ("python -m bench.burst_routes --workload "
                                                "long-documents",
                                                "the same with the margin pricing (the "
                                                "default)", ""),
    "burst-routes-margin.json": ("python -m bench.burst_routes",
                                 "the same with the margin pricing (the default): from c=2 "
                                 "on, the first 3 arrivals small, then all large", ""),
    "burst-routes-prompt.json": ("python -m bench.burst_routes --pricing prompt",
                                 "decisions under bursts with the pricing by prompt length "
                                 "(the default until 53047e9): small 69% / 17% / 3% / 3% at "
                                 "1 / 2 / 4 / 8 clients", ""),
    "burst-routes-pairs.json": ("python -m bench.burst_routes --pricing pairs",
                                "the same with a pair priced at its share (the default "
                                "since): small 69% / 65% / 4% / 3% at 1 / 2 / 4 / 8 clients "
                                "(the shipped H200 curves, decisions only)", ""),
    "burst-routes-prompt-long-documents.json": (
        "python -m bench.burst_routes --pricing prompt --workload long-documents",
        "long documents under bursts, the pricing by prompt length: small 51% / 51% / 38% / "
        "40% at 1 / 2 / 4 / 8 clients", ""),
    "burst-routes-prompt-long-documents-profile.json": (
        "python -m bench.burst_routes --pricing prompt --workload long-documents "
        "--profile-from bench/results/gpu-loops-chat-traffic-direct-h100.json",
        "the same with the 8B's batch profile from the H100 loops: 51% / 51% / 51% / 41%", ""),
    "burst-routes-prompt-profile.json": (
        "python -m bench.burst_routes --pricing prompt --profile-from "
        "bench/results/gpu-loops-chat-traffic-direct-h100.json",
        "the same with the 8B's batch profile from the H100 closed loops: small 69% / 65% / "
        "60% / 4%", ""),
    "ab-records-c50.json": ("python -m bench.ab --base 4eee0f6 --rounds 3 --seconds 6 "
                            "--connections 50 --out bench/results/ab-records-c50.json",
                            "the request's records slotted and unfrozen at run time "
                            "(app.record): forced c=50 2,459 -> 2,565 req/s, every round",
                            ""),
    "ab-records-c50-repeat.json": ("python -m bench.ab --base 4eee0f6 --rounds 4 --seconds 6 "
                                   "--connections 50 (at 119ea45, the router's records "
                                   "too)",
                                   "the records A/B repeated: forced c=50 2,407 -> 2,502 "
                                   "req/s, every round", ""),
    "without-decision-auto.json": ("python -m bench.without --model auto --part \"routed "
                                   "decision\" --out bench/results/without-decision-auto.json",
                                   "auto as is against a copy whose router decides once per "
                                   "prompt, and the pass-through, at c=50: what the decision "
                                   "costs under load", ""),
    "ab-batch-profile-auto-c50.json": (
        "python -m bench.ab --base 506d4cf --model auto --connections 50 --rounds 3 "
        "--seconds 6 --out bench/results/ab-batch-profile-auto-c50.json",
        "this stop's pricing change (Curve.joins in the margin branch) and the rest, on a "
        "loaded auto gateway: 1,741 -> 1,761 req/s, 0.594 -> 0.587 ms CPU a request "
        "(medians of 3 in turns): no cost", ""),
    "ab-turn-auto-c50.json": ("python -m bench.ab --base c611689 --model auto --rounds 3 "
                              "--seconds 6 --connections 50 --out "
                              "bench/results/ab-turn-auto-c50.json",
                              "routed decisions made together once per turn of the event "
                              "loop (app/forward/turn.py): auto c=50 1,569 -> 1,810 req/s, "
                              "p99 155 -> 58 ms, every round", ""),
    "ab-turn-auto-c8.json": ("python -m bench.ab --base c611689 --model auto --rounds 3 "
                             "--seconds 6 --connections 8 --out "
                             "bench/results/ab-turn-auto-c8.json",
                             "the same at c=8: 1,403 -> 1,468 req/s, every round", ""),
    "ab-turn-auto-c1.json": ("python -m bench.ab --base c611689 --model auto --rounds 4 "
                             "--seconds 6 --connections 1 --out "
                             "bench/results/ab-turn-auto-c1.json",
                             "the same at c=1 (an idle gateway plans at once): p50 0.91 vs "
                             "0.945 ms, within this VM's A/B side bias", ""),
    "ab-records-auto-c50.json": ("python -m bench.ab --base 926e137 --model auto --rounds 3 "
                                 "--seconds 6 --connections 50 --out "
                                 "bench/results/ab-records-auto-c50.json",
                                 "the router's records unfrozen at run time too: auto c=50 "
                                 "1,563 -> 1,582 req/s (every round, within 4%)", ""),
    "ab-no-replace-auto-c50.json": ("python -m bench.ab --base e0abbd9 --model auto --rounds 4 "
                                    "--seconds 6 --connections 50 --out "
                                    "bench/results/ab-no-replace-auto-c50.json",
                                    "UsageRow.with_figure and Query.under instead of "
                                    "dataclasses.replace: auto c=50 1,537 -> 1,571 req/s "
                                    "(median; 3 of 4 rounds)", ""),
    "without.json": ("python -m bench.without --rounds 3 --seconds 6",
                     "the forced tier at c=50 as it is, without its journal line, its "
                     "usage row or all post-answer bookkeeping, with its records handed to "
                     "another process, and the bare pass-through, in turns: 0.59x / 0.61x / "
                     "0.67x / 0.84x / 0.80x of the pass-through's req/s",
                     ""),
    "syscalls.json": ("python -m bench.syscalls",
                      "system calls per forwarded request at c=50 under strace: the "
                      "pass-through 6.2, the forced tier 20.1, auto 21.8 "
                      "(getpid, journal writes, futexes), with one call's cost", ""),
    "server-ab.json": ("python -m bench.server_ab --rounds 3 (pip install granian)",
                       "the ASGI server in turns under the bare pass-through: granian "
                       "0.96x uvicorn's req/s at c=50, 0.60x at c=1; uvicorn kept", ""),
    "route-eval-seeds.json": ("python -m bench.route_eval_seeds",
                              "APGR and controls over five held-out splits", ""),
    "route-eval.json": ("python -m bench.route_eval",
                        "APGR, CPT, controls; easy/hard tiers on held-out open requests, "
                        "the workload's prompts and the stop-52 probe; energy saved at "
                        "quality targets and by sample size; the thinking pair's budgets",
                        ""),
    "route-eval.png": ("same", "route-eval.json as a picture", ""),
    "route-stretch.json": ("python -m bench.route_stretch",
                           "how the complexity model's easy stretch and own-item weight were "
                           "chosen: 4-fold cross-validation on the own open prompts", ""),
    "attribution-dating.json": ("python -m bench.attribution_dating",
                                "short requests one at a time through the real ledger on a "
                                "simulated 100 ms counter, its changes dated at the read, at "
                                "the bracket's middle, at the cadence's expected step: each "
                                "request's figure against the energy it added (simulated)",
                                ""),
    "interpreters-c50.json": ("python -m bench.interpreters --python <3.12 venv> --python "
                              "<3.13 venv> --rounds 5 --seconds 6",
                              "the gateway (forced tier) and the bare pass-through at c=50 "
                              "under CPython 3.11, 3.12 and 3.13, in turns: the ratio 0.73-0.74x "
                              "under each", ""),
    "cadence-sim.json": ("python -m bench.cadence_sim", "the sampler's reads on the 20 Hz "
                         "timer and on the counter's beat, against a simulated 100 ms-step "
                         "counter, and how far off each change's date is (simulated, not "
                         "NVML)", ""),
    "sampler-cost-nvml-h100.json": ("python -m bench.sampler_cost --nvml 0 --seconds 6 --rounds 2 "
                                    "(on the device, c4bb70c)",
                                    "the energy sampler on an H100's NVML counter (steps every "
                                    "100 ms): on its beat 12.7 reads a second and 6.5% of a core "
                                    "against 20 and 8.8% on the 20 Hz timer (40.2% at 100 Hz); "
                                    "each change seen 5.2 ms after its step (p90 19.6; timer "
                                    "17.4) and dated 3.1 ms off it (p90 11.7, mean -0.2; 17.4 "
                                    "at the read)", ""),
    "sampler-cost-estimate-h100-host.json": ("python -m bench.sampler_cost --seconds 5 "
                                             "--rounds 1 (on the device, bb47cb1)",
                                             "the same on that host's CPU estimate: the quiet "
                                             "rate stays near 100 Hz (92 reads a second)", ""),
    "sampler-cost-estimate.json": ("python -m bench.sampler_cost --seconds 8 --rounds 2",
                                   "the energy sampler's CPU, reads a second and read time at "
                                   "20 Hz, the quiet rate as shipped and 100 Hz flat, on this "
                                   "VM's CPU estimate (/proc/stat: ~0.2 ms a read, so the quiet "
                                   "rate stays near 100 Hz)", ""),
    "route.json": ("python -m bench.route_latency", "decision time, 2,000-token conversation",
                   ""),
    "tolerance-sweep.json": ("python -m bench.tolerance_sweep",
                             "energy and expected quality by quality target (H200 curves, "
                             "estimate)", ""),
    "tolerance-sweep.png": ("same", "tolerance-sweep.json as a picture", ""),
    "tolerance-scaling.json": ("python -m bench.tolerance_scaling",
                               "routing.full_tolerance_from 0 / 0.5 / 0.6 / 0.7 / 0.8 on the "
                               "training prompts' labels and the reference workload's expected "
                               "saving at 0.95 (estimate)", ""),
}


def _recorded(name: str) -> dict[str, object]:
    """The JSON of a result (a PNG's: the JSON beside it), or {}."""
    path = RESULTS / (name if name.endswith(".json") else Path(name).stem + ".json")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# Files written before results recorded their commit: the commit that added
# them (`git log --diff-filter=A -- bench/results/<file>`), run with its code.
ADDED_IN = {"classifier-embedding.json": "bc552c2", "cpu-curves.png": "3c94dba",
            "dashboard-energy-panels.png": "830c629"}


def _commit(data: dict[str, object], name: str = "") -> str:
    commit = data.get("commit")
    if not commit:
        return f"added in {ADDED_IN[name]}" if name in ADDED_IN else "not recorded"
    return str(commit)[:12] + ("+uncommitted" if "+uncommitted" in str(commit) else "")


def render() -> str:
    files = sorted(p.name for p in RESULTS.iterdir() if p.name != "README.md")
    missing = sorted(set(files) - set(CATALOGUE))
    gone = sorted(set(CATALOGUE) - set(files))
    if missing or gone:
        raise SystemExit(f"bench/index.py: not catalogued {missing}; catalogued, no file {gone}")
    lines = ["# Benchmark results", "",
             "Written by `python -m bench.index` from the files here (do not edit by hand).",
             "Energy figures name their source inside each file; superseded runs are "
             "deleted (git keeps them).", "",
             "| file | command | commit | what it shows | superseded by |",
             "|---|---|---|---|---|"]
    for name in files:
        command, what, superseded = CATALOGUE[name]
        data = _recorded(name)
        command = command.replace("{base}", str(data.get("base", "<base>")))
        lines.append(f"| [{name}]({name}) | `{command}` | {_commit(data, name)} | {what} | "
                     f"{superseded or '-'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text, path = render(), RESULTS / "README.md"
    if args.check:
        if not path.exists() or path.read_text() != text:
            print("bench/results/README.md is out of date: python -m bench.index",
                  file=sys.stderr)
            sys.exit(1)
        return
    path.write_text(text)


if __name__ == "__main__":
    main()
