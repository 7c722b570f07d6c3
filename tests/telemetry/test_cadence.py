"""The cadence learns a stepping counter's beat and reads once just after each
step (plus a probe every few beats): simulated time (bench/cadence_sim.py), a
counter that steps on a beat with jitter, reads that take milliseconds and
start late."""

from __future__ import annotations

import statistics

from bench.cadence_sim import beats
from bench.cadence_sim import simulate as run
from telemetry.cadence import RELEARN_AFTER_S, Cadence


def test_reads_once_just_after_each_step_of_a_100ms_counter() -> None:
    """NVML's beat (100 ms, ~4 ms a read): ~12.5 reads a second (20 on the
    timer), each step seen ~10 ms after it (0-50 ms on the timer)."""
    r = run(beats(0.1, 60), 60)
    assert r.cadence.state == "locked"
    assert r.cadence.beat_s is not None and abs(r.cadence.beat_s - 0.1) < 0.0005
    assert r.merged == 0  # every step seen on its own
    assert r.reads_per_s < 13.5
    assert r.lag_median_s < 0.012 and max(r.lags_s) < 0.025
    # each change dated at the step it expected: within a few ms, unbiased
    errors = sorted(abs(e) for e in r.dated_s)
    assert errors[len(errors) // 2] < 0.004 and errors[int(0.9 * len(errors))] < 0.008
    assert abs(statistics.fmean(r.dated_s)) < 0.003
    # the timer's lag depends on its phase against the steps (0-50 ms): over
    # five phases its median is ~30 ms (bench/results/cadence-sim.json)
    timer = run(beats(0.1, 60), 60, on_beat=False)
    assert timer.reads_per_s > 19.5
    # the bracket's middle (a dear counter off the beat) is off by at most half
    # the bracket (one timer period and a read; unbiased only over phases)
    assert max(abs(e) for e in timer.middle_s) < 0.03


def test_late_wakes_and_jitter_keep_every_step() -> None:
    """A thread that wakes up to 10 ms late (an event loop holding the
    interpreter) and a beat with ±3 ms jitter: still one read a step or so."""
    for seed in range(5):
        r = run(beats(0.1, 40, jitter_s=0.003, seed=seed), 40, late_s=0.01, seed=seed)
        assert r.cadence.state == "locked"
        assert r.merged == 0
        assert r.reads_per_s < 14
        assert r.lag_median_s < 0.02


def test_reads_that_take_longer_just_after_a_step_keep_the_dates_close() -> None:
    """An H100's NVML read takes ~1.6 ms longer just after a step (5.3 against
    3.7 ms, bench/results/sampler-cost-nvml-h100.json): the beat holds, one
    read a step or so, each change dated within a few ms of its step."""
    for seed in range(3):
        r = run(beats(0.1, 40, seed=seed), 40, seed=seed, after_step_s=0.0016)
        assert r.cadence.state == "locked" and r.merged == 0
        assert r.reads_per_s < 13.5
        errors = sorted(abs(e) for e in r.dated_s)
        assert errors[len(errors) // 2] < 0.004 and abs(statistics.fmean(r.dated_s)) < 0.004


def test_follows_a_beat_that_moves() -> None:
    """A beat that stretches from 100 to 105 ms, one that jumps from 100 to
    90 ms, and a 250 ms one: each is measured from the bracketed steps and
    followed (after a jump, learned again)."""
    stretching = [0.03 + k * 0.1 + k * k * 0.005 / 800 for k in range(400)]
    r = run(stretching, 40)
    assert r.cadence.state == "locked" and r.merged == 0
    assert r.cadence.beat_s is not None and abs(r.cadence.beat_s - 0.105) < 0.001
    jump = [0.03 + k * 0.1 for k in range(100)] + [10.03 + k * 0.09 for k in range(1, 300)]
    r = run(jump, 30)
    assert r.cadence.state == "locked" and r.merged <= 3
    assert r.cadence.beat_s is not None and abs(r.cadence.beat_s - 0.09) < 0.001
    r = run(beats(0.25, 40), 40)
    assert r.cadence.state == "locked" and r.merged == 0 and r.reads_per_s < 6


def test_a_counter_without_a_slow_beat_is_read_on_the_timer() -> None:
    """A counter that moves every 10 ms (a CPU estimate, RAPL) or faster than
    the timer would read it: off, on the timer, learning again only after
    RELEARN_AFTER_S (then twice that)."""
    for beat_s in (0.01, 0.04):
        r = run(beats(beat_s, 30), 30)
        assert r.cadence.state == "off" and r.cadence.learned == 0
        assert 19 < r.reads_per_s < 21  # the timer's 20
    c = Cadence()
    c.observe(0.0, 0.004, False)
    assert c.next_read(0.004, 0.05) == 0.004 + 0.002  # learning: back to back
    c._off(1.0)
    assert c.next_read(1.1, 1.15) == 1.15
    assert c.next_read(1.0 + RELEARN_AFTER_S, 9e9) < 9e9  # learning again
    c._off(100.0)
    assert c.next_read(100.0 + 1.5 * RELEARN_AFTER_S, 123.0) == 123.0  # the next wait is doubled


def test_a_stalled_counter_falls_back_to_the_timer() -> None:
    """Steps stop (a device gone quiet in its counter): the cadence looks for
    half a beat, learns for at most LEARN_FOR_S, then reads on the timer."""
    steps = [s for s in beats(0.1, 30) if s < 10]
    r = run(steps, 30)
    assert r.cadence.state == "off"
    late = run(steps, 30)
    assert late.reads_per_s < 25  # timer reads, and one learning burst of at most 2 s


def test_reads_that_stop_coming_make_it_learn_again() -> None:
    """Failing reads are retried on the sampler's timer; when reads come back
    after more than half a beat, the phase is not trusted."""
    r = run(beats(0.1, 10), 10)
    assert r.cadence.state == "locked"
    assert r.cadence.next_read(20.0, 20.05) == 20.0 + 0.002
    assert r.cadence.state == "learning"


def test_dating_changes_at_their_steps_sharpens_short_requests_figures() -> None:
    """The real ledger on a simulated 100 ms counter, short requests one at a
    time (bench/attribution_dating.py): dated at the read that found them,
    changes shift energy between neighbouring requests; dated at the step the
    cadence expected (or the bracket's middle on the timer), far less."""
    from bench.attribution_dating import run as dating
    rows = dating(60.0, 2)
    read = rows["at the read, on the timer"]["all"]["error_pct_p90"]
    beat = rows["the expected step, on the beat"]["all"]["error_pct_p90"]
    middle = rows["bracket middle, on the timer"]["all"]["error_pct_p90"]
    assert beat < read / 2 and middle < read / 2
    assert rows["the expected step, on the beat"]["share_of_energy_reaching_requests_pct"] > 99
