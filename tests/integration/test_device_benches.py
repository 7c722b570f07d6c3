"""The device benchmarks' Python end to end on this machine's CPU: the
routing curves and replays (bench/gpu_routing.py, what run_h200.sh calls),
the thinking pair (gpu_thinking.py, run_h200_thinking.sh) and the closed
loops (gpu_mixed.py, run_h200_mixed.sh), with the tiny test models in place
of the GPU's shapes, `estimate` in place of NVML and sweeps small enough for
two cores. A device call costs minutes of a session's 30; a script that
breaks should break here first. What only the device has (the CUDA build,
NVML itself) is not covered."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workers.local import ROOT, model_path

pytestmark = pytest.mark.integration

SHAPES = ("tiny-small", "tiny-large", "tiny-think")


@pytest.fixture(scope="module")
def bench_dirs(llama_bin: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("device-benches")
    dirs = {name: root / name for name in ("models", "curves", "out", "data")}
    for d in dirs.values():
        d.mkdir()
    # The workloads draw some prompts from public sets (../shared/data on a
    # development machine, .data on the device); a few lines of the same form
    # stand in for them here, where only the scripts' plumbing is tested.
    for name, key, lines in (
            ("gsm8k/train.jsonl", "question", [
                "A shelf holds 4 rows of 12 books. 9 are lent out. How many remain?",
                "Tom walks 3 km a day for 2 weeks. How far does he walk?"]),
            ("arena-hard/v0.1-question.jsonl", "prompt", [
                "Write a python function that merges two sorted lists.",
                "Explain how a hash map handles collisions, with a short code example."])):
        path = dirs["data"] / name
        path.parent.mkdir()
        path.write_text("".join(json.dumps({key: line}) + "\n" for line in lines))
    for shape in SHAPES:
        (dirs["models"] / f"{shape}.gguf").symlink_to(model_path(shape))
    # the thinking pair: two backends of the one tiny reasoning shape
    (dirs["models"] / "tiny-think-large.gguf").symlink_to(model_path("tiny-think"))
    return dirs


def _run(script: str, dirs: dict[str, Path], llama_bin: str, small: str, large: str,
         *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOULEGATE_")}
    env |= {"PYTHONPATH": str(ROOT), "JOULEGATE_DATA": str(dirs["data"])}
    out = subprocess.run(
        [sys.executable, f"bench/{script}", "--llama-server", llama_bin,
         "--models-dir", str(dirs["models"]), "--out", str(dirs["out"]),
         "--curves-dir", str(dirs["curves"]), "--source", "estimate",
         "--small", small, "--large", large, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    return out.stdout


def _read(dirs: dict[str, Path], name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((dirs["out"] / name).read_text())
    return data


@pytest.mark.timeout(900)  # ~3 min alone on 2 cores; over 300 s inside a clean-clone CI run
def test_routing_calibrate_replay_and_the_profiled_split(bench_dirs: dict[str, Path],
                                                         llama_bin: str) -> None:
    pair = ("tiny-small", "tiny-large")
    _run("gpu_routing.py", bench_dirs, llama_bin, *pair, "--phase", "calibrate",
         "--prompts", "16,64,128", "--completions", "8,16,32")
    curves = _read(bench_dirs, "gpu-curves.json")
    assert curves["source"] == "estimate" and curves["mape_holdout"] >= 0
    assert {p.name for p in bench_dirs["curves"].glob("*.json")} == \
        {"tiny-small.json", "tiny-large.json"}

    _run("gpu_routing.py", bench_dirs, llama_bin, *pair, "--phase", "replay", "--n", "8",
         "--concurrency", "1,8")
    replay = _read(bench_dirs, "gpu-routing-chat-traffic.json")
    for conc in ("concurrency_1", "concurrency_8"):
        modes = replay[conc]["modes"]
        assert {"auto", "large"} <= set(modes)
        # every turn of each mode answered all 8 (modes run one or two turns)
        assert all(m["answered"] in (8, 16) and not m["failed"] for m in modes.values()), \
            {k: (m["answered"], m["failed"]) for k, m in modes.items()}
    assert (bench_dirs["out"] / "gpu-routing-chat-traffic.png").stat().st_size > 0

    # run_h200.sh's SPLIT=1 SECOND=prompt PROFILE_FROM=... ANSWERS=varied: auto
    # with a batch profile on the large curve, the second gateway without, each
    # request's answer length drawn
    _run("gpu_routing.py", bench_dirs, llama_bin, *pair, "--phase", "replay", "--n", "8",
         "--concurrency", "4", "--split", "--second", "prompt", "--profile-from",
         str(ROOT / "bench" / "results" / "gpu-loops-prompts-h100.json"), "--answers", "varied")
    split = _read(bench_dirs, "gpu-routing-chat-traffic-c4-split-profile-varied.json")
    assert split["auto_batch_profile"]["curve"] == "tiny-large"
    # which curves each gateway priced with: the profile on auto's alone
    assert split["auto_curves"]["tiny-large"]["batch_profile"]
    assert not split["second_curves"]["tiny-large"]["batch_profile"]
    assert split["workload"]["answer_tokens"]["direct"].startswith("varied: mean ")
    assert set(split["by_concurrency"]["c4"]["modes"]) == {"large", "auto", "split",
                                                          "auto-prompt"}


def test_thinking_calibrate_and_replay(bench_dirs: dict[str, Path], llama_bin: str) -> None:
    pair = ("tiny-think", "tiny-think-large")
    _run("gpu_thinking.py", bench_dirs, llama_bin, *pair, "--phase", "calibrate",
         "--prompts", "16,64,128", "--completions", "8,16,32")
    assert _read(bench_dirs, "gpu-thinking-curves.json")["source"] == "estimate"
    _run("gpu_thinking.py", bench_dirs, llama_bin, *pair, "--phase", "replay",
         "--n1", "4", "--n8", "8")
    result = _read(bench_dirs, "gpu-thinking.json")
    modes = result["concurrency_8"]["modes"]
    assert {"auto", "large-think", "large-nothink", "small-think"} <= set(modes), modes
    assert all(not m["failed"] for m in modes.values()), modes


def test_closed_loops_direct_and_through_the_gateway(bench_dirs: dict[str, Path],
                                                     llama_bin: str) -> None:
    if not (bench_dirs["curves"] / "tiny-large.json").exists():  # run alone
        shutil.copy(ROOT / "curves" / "h200" / "llama-8b.json",
                    bench_dirs["curves"] / "tiny-large.json")
        shutil.copy(ROOT / "curves" / "h200" / "llama-1b.json",
                    bench_dirs["curves"] / "tiny-small.json")
    _run("gpu_mixed.py", bench_dirs, llama_bin, "tiny-small", "tiny-large", "--seconds", "1",
         "--grid", "0:1,1:1", "--prompts", "fixed,chat-traffic", "--via-gateway",
         "--name", "loops")
    loops = _read(bench_dirs, "loops.json")
    assert loops["path"] == "through a joulegate gateway (forced tiers)"
    assert set(loops["points"]) == {"short", "long", "chat-traffic"}
    done = [p for pts in loops["points"].values() for p in pts
            if p["large"]["completed"]]
    assert done and all(p["joules_per_request"] > 0 for p in done)
    assert (bench_dirs["out"] / "loops.png").stat().st_size > 0


def test_varied_answer_lengths_keep_the_mean_and_are_the_same_in_every_mode() -> None:
    from bench.gpu_routing import ANSWER_RANGE, DIRECT_TOKENS, _body, answer_lengths

    lengths = answer_lengths(200, varied=True)
    assert lengths is not None and lengths == answer_lengths(200, varied=True)
    assert answer_lengths(200, varied=False) is None
    assert abs(sum(lengths) / len(lengths) - DIRECT_TOKENS) < 2
    assert min(lengths) >= ANSWER_RANGE[0] and max(lengths) <= ANSWER_RANGE[1]
    assert len(set(lengths)) > 50  # they vary
    assert _body("large", "x", "", 100)["max_tokens"] == 100
    assert _body("auto", "x", "", 100)["max_tokens"] == 100
    assert "max_tokens" not in _body("auto", "x")
    assert _body("small-cot", "x", "", 100)["max_tokens"] == 300
    # the split's CoT answer as auto's: capped by the request's length
    assert _body("split", "x", "small:cot", 100)["max_tokens"] == 100
    assert _body("split", "x", "small:cot")["max_tokens"] == 192
