"""The agent protocol's messages, defined once: the agent (telemetry/agent.py)
reads them and the gateway (app/metering/remote.py) writes them.

    POST BATCH_PATH  {"calls": [call, ...]}  -> {"results": [{"status", "body"}, ...]}

A call is {"call": one of CALLS, "device": name, ...}:
    open     "windows": [id, ...] (named by the gateway), "curve"?: 7 coefficients
             -> {"windows": [the ids opened]}
    close    "window": id, "points": [[offset_s, prompt_tokens, decode_tokens], ...]
             -> an EnergyFigure
    result   "window": id, "wait_s"? (single calls only)  -> an EnergyFigure
    results  "windows": [id, ...], "final_only"?  -> {"figures": [figure | None | PENDING]}
Each call also has a path of its own (CALL_PATH + name) for a single call.
Every POST carries `Authorization: Bearer <the agent's token>` where the agent
has one, and GATEWAY_HEADER: the sending gateway process's id (its windows are
its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from telemetry.timeline import EnergyFigure, Point

BATCH_PATH = "/v1/windows/batch"
CALL_PATH = "/v1/windows/"
CALLS = ("open", "close", "result", "results")
GATEWAY_HEADER = "X-Joulegate-Gateway"
PENDING = {"final": False}  # a window whose figure is not final yet (results, final_only)


def open_call(device: str, windows: list[str], curve: Sequence[float] | None) -> dict[str, Any]:
    call: dict[str, Any] = {"call": "open", "device": device, "windows": windows}
    if curve is not None:
        call["curve"] = list(curve)
    return call


def close_call(device: str, window: str, points: list[Point]) -> dict[str, Any]:
    return {"call": "close", "device": device, "window": window, "points": points}


def result_call(device: str, window: str) -> dict[str, Any]:
    return {"call": "result", "device": device, "window": window}


def results_call(device: str, windows: list[str], final_only: bool) -> dict[str, Any]:
    return {"call": "results", "device": device, "windows": windows, "final_only": final_only}


def opened(answer: Any) -> list[str] | None:
    """The ids an open call's answer says were opened (None: not an answer)."""
    got = answer.get("windows") if isinstance(answer, dict) else None
    return got if isinstance(got, list) else None


def figures(answer: Any, asked: int) -> list[Any] | None:
    """A results call's figures, one per window asked (None: not an answer)."""
    got = answer.get("figures") if isinstance(answer, dict) else None
    return got if isinstance(got, list) and len(got) == asked else None


def batch_bodies(answer: Any, calls: int) -> list[Any] | None:
    """Each call's body from a batch answer (None where it failed); None when
    the answer is not a batch answer for `calls` calls."""
    results = answer.get("results") if isinstance(answer, dict) else None
    if not isinstance(results, list) or len(results) != calls:
        return None
    return [r.get("body") if isinstance(r, dict) and r.get("status") == 200 else None
            for r in results]


def batch_answer(results: list[tuple[int, Any]]) -> dict[str, Any]:
    return {"results": [{"status": status, "body": body} for status, body in results]}


def as_figure(data: Any) -> EnergyFigure | None:
    """An EnergyFigure from its JSON (None: no figure)."""
    if not isinstance(data, dict) or data.get("net_j") is None:
        return None
    return EnergyFigure(**{k: data[k] for k in EnergyFigure.__dataclass_fields__ if k in data})
