"""What per-step attribution can reach on the gpu_telemetry mix, by the curve alone.

Simulates the eight requests of bench/gpu_telemetry.py run together on the
1B's H200 curve: prefill together, then one answer token per request per
step, each step's energy split by the curve's marginal token costs (exactly
what the ledger does), and compares each request's share of the batch with
its share of the standalone costs. No GPU: it shows which part of the
measured share error any per-step split must keep (a request that finishes
last runs its tail alone and pays all of it).

    python -m bench.attribution_model  ->  bench/results/attribution-model.json
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.gpu_common import project_commit
from bench.gpu_telemetry import MIX
from telemetry.rates import TokenRates

ROOT = Path(__file__).resolve().parent.parent


def simulate(rates: TokenRates) -> dict[str, object]:
    charge = [p * rates.prefill_rate(len(MIX), 0.0) for p, _ in MIX]
    for k in range(max(c for _, c in MIX)):
        live = [i for i, (_, c) in enumerate(MIX) if c > k]
        for i in live:
            charge[i] += rates.decode_rate(MIX[i][0], len(live))
    alone = [rates.standalone_joules(p, c) or 0.0 for p, c in MIX]
    scale = sum(charge) / sum(alone)
    err = [abs(ch - a * scale) / (a * scale) for ch, a in zip(charge, alone, strict=True)]
    return {"share_errors": err, "share_median_abs_error": statistics.median(err),
            "batch_to_alone_ratio_model": scale}


def main() -> None:
    curve = ROOT / "curves" / "h200" / "llama-1b.json"
    rates = TokenRates.from_curve(json.loads(curve.read_text())["coef"])
    result = {"curve": str(curve.relative_to(ROOT)), "source": "estimate (curve model, no GPU)",
              "requests": [{"prompt_tokens": p, "completion_tokens": c} for p, c in MIX],
              **simulate(rates), "commit": project_commit()}
    out = ROOT / "bench" / "results" / "attribution-model.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
