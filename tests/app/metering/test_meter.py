"""The in-process meter hands each waiting request its final figure: when a
counter step makes it final (a few as each request ends, the rest shortly
after), at once when it already is, and the provisional one after the
timeout when the counter stopped."""

from __future__ import annotations

import asyncio
import itertools

from app.metering.local import LocalMeter
from app.metering.meter import GIVE_AFTER_S
from telemetry.ledger import Ledger
from telemetry.timeline import EnergyFigure
from tests.telemetry.fakes import Clock, SteppingCounter
from tests.telemetry.test_ledger import IDLE_W, drive


def _setup() -> tuple[LocalMeter, Ledger, SteppingCounter, Clock]:
    clock = Clock()
    counter = SteppingCounter(lambda t: IDLE_W + 100.0, clock)
    ledger = Ledger("nvml", prefill_weight=0.0, idle_power_w=IDLE_W, clock=clock)
    drive(ledger, counter, clock, 1.0)
    return LocalMeter({"gpu0": ledger}, settle_timeout_s=0.3), ledger, counter, clock


def test_final_figures_reach_their_requests() -> None:
    meter, ledger, counter, clock = _setup()
    got: dict[str, EnergyFigure | None] = {}

    async def run() -> None:
        windows = [await meter.open("gpu0") for _ in range(3)]
        drive(ledger, counter, clock, 1.5)
        for w in windows:
            assert w is not None
            await meter.close(w, [(0.0, 10, 0), (0.4, 10, 20)])
            meter.when_final(w, lambda f, w=w: got.__setitem__(w, f))
        assert not got  # nothing is final before the next counter step
        drive(ledger, counter, clock, 2.0)  # steps: all three final, one hop to the loop
        await asyncio.sleep(0.01)
        assert not got  # their turn: an ending request's, or GIVE_AFTER_S later
        meter.give_some()  # a request ends: two of them, in order
        assert list(got) == windows[:2]
        await asyncio.sleep(GIVE_AFTER_S + 0.02)  # no request ended since: the rest
        assert len(got) == 3 and all(f is not None and f.final for f in got.values())
        meter.give_some()  # nothing left: nothing happens
        meter.when_final(windows[0], lambda f: got.__setitem__("again", f))
        await asyncio.sleep(0.01)  # already final: given at once
        assert got["again"] == got[windows[0]]

    asyncio.run(run())


async def _one_waiting(meter: LocalMeter, ledger: Ledger, counter: SteppingCounter,
                       clock: Clock, got: list[EnergyFigure | None]) -> None:
    """A request run and closed, its callback left; no counter step since."""
    w = await meter.open("gpu0")
    assert w is not None
    drive(ledger, counter, clock, 1.5)
    await meter.close(w, [(0.0, 10, 0), (0.4, 10, 20)])
    meter.when_final(w, got.append)


def test_a_stopped_counter_gives_the_provisional_figure_after_the_timeout() -> None:
    meter, ledger, counter, clock = _setup()
    got: list[EnergyFigure | None] = []

    async def run() -> None:
        await _one_waiting(meter, ledger, counter, clock, got)
        await asyncio.sleep(0.1)
        assert not got
        await asyncio.sleep(0.6)  # the timeout (0.3 s) and a sweep (every 0.25 s)
        assert len(got) == 1 and got[0] is not None and not got[0].final
        await meter.drain(1.0)  # nothing left waiting: returns at once

    asyncio.run(run())


def test_drain_gives_every_waiting_request_a_figure() -> None:
    meter, ledger, counter, clock = _setup()
    got: list[EnergyFigure | None] = []

    async def run() -> None:
        await _one_waiting(meter, ledger, counter, clock, got)
        await meter.drain(0.0)

    asyncio.run(run())
    assert len(got) == 1 and got[0] is not None


def test_a_failing_agent_is_asked_again_sooner_first_then_once_a_second() -> None:
    """While an agent fails and few figures wait for it, they are asked for
    after one poll, then at twice the last pause up to DOWN_POLL_S: a blip
    costs a poll or two, a long outage one exchange a second; all its devices
    in the same poll; an agent that answers again is asked every poll; with
    thousands waiting, once a second from the start."""
    from app.metering import remote

    meter = remote.RemoteMeter(None, {"gpu0": "http://a", "gpu1": "http://a/"},  # type: ignore[arg-type]
                               poll_s=0.125)  # steps exact in binary
    agent = meter._agents["gpu0"]
    assert meter._agents["gpu1"] is agent
    agent._outage.fail("refused")
    asked = []
    for step in range(48):  # six seconds of polls
        now = 0.125 * step
        if not meter._skip("gpu0", now):
            assert not meter._skip("gpu1", now)  # the same poll asks its other device
            asked.append(now)
    assert asked[:5] == [0.0, 0.125, 0.375, 0.875, 1.875]
    assert all(b - a == remote.DOWN_POLL_S for a, b in itertools.pairwise(asked[4:]))
    assert len(asked) == 9
    agent._outage.answered()
    assert not meter._skip("gpu0", 6.0) and not meter._skip("gpu0", 6.0)
    # Thousands waiting (under load): once a second from the start.
    agent._outage.fail("refused")
    many = [t for t in (6.0 + 0.125 * step for step in range(24))
            if not meter._skip("gpu0", t, waiting=5000)]
    assert many == [6.0, 7.0, 8.0]
