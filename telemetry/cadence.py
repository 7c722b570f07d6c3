"""When to read an energy counter that moves in steps on a steady beat.

NVML's energy counter changes every ~100 ms (../shared/bench/h200-nvml-steps.txt:
median 100.03 ms on an H200; 10.0 changes a second on an H100,
bench/results/sampler-cost-nvml-h100.json) and one read costs ~4 ms of CPU.
On a fixed timer at 20 Hz half the reads find the counter where it was, and
each change is seen 0-50 ms after it happened: that is how far a span's ends,
and so a short request's share of a step, are off. A Cadence learns the beat
and its phase from the reads themselves and puts one read just after each
expected step, and one more before it every few beats:

- learning: reads back to back (LEARN_GAP_S apart) until LEARN_STEPS changes
  have each been seen between a read that found no change and one that did;
  if their intervals agree within BEAT_AGREE (and the brackets' widths) and
  are no shorter than `min_beat_s` (a beat faster than the sampler's timer
  would cost more reads than the timer), that is the beat.
- locked: a read MARGIN_S after each expected step; every PROBE_EVERY beats,
  and after any surprise, one more just before it (the probe), which brackets
  the step to a few milliseconds. A step bracketed away from where it was
  expected moves the phase to it; every bracketed step re-measures the beat
  from an earlier one, counting the steps between (so the beat sharpens
  with every beat, and follows a slow drift: the anchor moves on every
  ANCHOR_SPAN steps). A read that finds no change where one was due reads
  again MARGIN_S later; half a beat late with no change, or a bracketed
  step off the beat by BEAT_OFF, and it learns again.
- off: the sampler's timer (a counter with no steady beat, or a stalled one),
  learning again RELEARN_AFTER_S later, doubling while it keeps failing.

It also dates each change: the counter's new value is the energy up to the
step, not up to the read that found it, so a span's ends are the steps'
times. On the beat that is the expected step; elsewhere the middle of the
change's bracket (from the start of the last read that found no change to
the end of the one that found it), or the read's end where no read before
it found the counter still (a counter that moves on every read: its value
is the read's).

Pure decisions on times: the sampler thread tells it each read's start, end
and whether the counter moved, and asks when to read next.
"""

from __future__ import annotations

import itertools
import math
import statistics

LEARN_GAP_S = 0.002  # between reads while learning (each read takes its own time too)
LEARN_STEPS = 4  # bracketed changes to take a beat from (three intervals)
LEARN_FOR_S = 2.0  # learning gives up after this long
BEAT_AGREE = 0.05  # intervals within this share of their median (and bracket widths): a beat
MIN_BEAT_S = 0.02  # a counter changing faster is read on the timer (RAPL, the CPU estimate)
MARGIN_S = 0.003  # after an expected step (and before it, for the probe)
BEAT_OFF = 0.25  # a bracketed step this far off the beat (a share of it): learn again
ANCHOR_SPAN = 100  # steps after which the beat is measured from a newer anchor
ANCHOR_MIN = 8  # steps from a newer anchor before the beat is measured from it
PROBE_EVERY = 8  # beats between probes while nothing surprises
RELEARN_AFTER_S = 60.0
RELEARN_MAX_S = 960.0
READ_WEIGHT = 0.2  # of the newest read's time in its average


class Cadence:
    def __init__(self, min_beat_s: float = MIN_BEAT_S) -> None:
        """`min_beat_s`: a beat shorter than this is read on the timer instead
        (the sampler passes the beat below which its timer reads less often)."""
        self.min_beat_s = max(MIN_BEAT_S, min_beat_s)
        self.state = "off"  # "off", "learning" or "locked"
        self.beat_s: float | None = None
        self.learned = 0  # times a beat was learned
        self._relearn_at = float("-inf")  # while off: learn again from here on
        self._relearn_s = RELEARN_AFTER_S
        self._learn_until = 0.0
        self._changed_at = -math.inf  # learning: the end of the last read that saw a change
        self._steps: list[tuple[float, float]] = []  # learning: bracketed changes (lo, hi)
        # the start of the last read since a change that found none
        self._unchanged_at: float | None = None
        self._read_s = 0.0
        self._step = 0.0  # the last step's time, estimated
        self._anchor = 0.0  # a bracketed step the beat is measured from
        self._counted = 0  # steps seen since the anchor
        self._reanchored = False  # the anchor is a later one than the lock's
        self._beats = 0  # beats since the last bracketed step
        self._probe = False  # read before the next expected step too

    def observe(self, start: float, end: float, changed: bool) -> float:
        """One read, from `start` to `end`; `changed`: the counter moved since
        the read before it. Returns when the value it found was reached: the
        change's time, estimated (`end` for a read that found no change)."""
        took = end - start
        self._read_s += (READ_WEIGHT if self._read_s else 1.0) * (took - self._read_s)
        lower = self._unchanged_at
        self._unchanged_at = None if changed else start
        if self.state == "learning":
            self._learning(end, changed, lower)
        elif self.state == "locked" and self._locked(end, changed, lower):
            return self._step  # a change on the beat: the step it expected
        if not changed or lower is None:
            return end
        return (lower + end) / 2

    def next_read(self, now: float, timer_t: float) -> float:
        """When to read next, after a read that ended at `now`; `timer_t`: when
        the sampler's own timer would."""
        if self.state == "off":
            if now < self._relearn_at:
                return timer_t
            self._learn(now)
        if self.state == "learning":
            if now <= self._learn_until:
                return now + LEARN_GAP_S
            self._off(now)
            return timer_t
        assert self.beat_s is not None
        due = self._step + self.beat_s
        if now > due + self.beat_s / 2:  # no read has come for a while (failing reads)
            self._learn(now)
            return now + LEARN_GAP_S
        if now >= due:  # read at or after the step found no change: it is late
            return now + MARGIN_S
        probe_t = due - MARGIN_S - self._read_s
        if self._probe and now < probe_t:
            return probe_t
        return due + MARGIN_S

    def _learning(self, end: float, changed: bool, lower: float | None) -> None:
        if changed:
            # two changes closer than the shortest beat allows (less two reads'
            # worth of doubt): a counter that moves too often to lock on
            if end - self._changed_at < self.min_beat_s - 2 * (self._read_s + LEARN_GAP_S):
                self._off(end)
                return
            self._changed_at = end
            if lower is not None:
                self._steps.append((lower, end))
        if len(self._steps) >= LEARN_STEPS:
            pairs = list(itertools.pairwise(self._steps))
            gaps = [(b[0] + b[1] - a[0] - a[1]) / 2 for a, b in pairs]
            beat = statistics.median(gaps)
            # each gap is off by up to half of each of its two brackets' widths
            if beat >= self.min_beat_s and all(
                    abs(g - beat) <= BEAT_AGREE * beat + (a[1] - a[0] + b[1] - b[0]) / 2
                    for g, (a, b) in zip(gaps, pairs, strict=True)):
                self.state, self.beat_s, self.learned = "locked", beat, self.learned + 1
                self._step = self._anchor = sum(self._steps[-1]) / 2
                self._counted, self._reanchored = 0, False
                self._beats, self._probe, self._relearn_s = 0, False, RELEARN_AFTER_S
                return
            self._off(end)
        elif end > self._learn_until:
            self._off(end)

    def _locked(self, end: float, changed: bool, lower: float | None) -> bool:
        """Follows the beat; True where a change was placed on it (`_step`)."""
        beat = self.beat_s
        assert beat is not None
        due = self._step + beat
        if not changed:
            if end < due:
                self._probe = False  # the probe (or an early read) is done
            elif end > due + beat / 2:  # half a beat late and still no change: lost
                self._learn(end)
            return False
        if end > due + beat / 2:  # the read came late (the thread was held): steps went by
            passed = math.floor((end - self._step) / beat)
            self._step += beat * passed
            self._counted += passed
            self._probe = True
            return True
        self._counted += 1
        lo = max(lower if lower is not None else -math.inf, due - beat / 2)
        on_beat = lo < due <= end
        if end - lo <= 4 * (MARGIN_S + self._read_s):  # bracketed: phase and beat from it
            mid = (lo + end) / 2
            measured = (mid - self._anchor) / self._counted  # steps counted, not guessed
            if abs(measured - beat) > BEAT_OFF * beat:
                self._learn(end)
                return False
            if self._counted >= (ANCHOR_MIN if self._reanchored else 1):
                self.beat_s = measured
            if self._counted >= ANCHOR_SPAN:  # the beat of the last ANCHOR_SPAN steps, not all
                self._anchor, self._counted, self._reanchored = mid, 0, True
            # a step inside a bracket the schedule put around the expected one
            # says only that it is there: the bracket's middle sits where the
            # schedule put it, moved by late wakes and by reads that take longer
            # just after a step (an H100: 5.3 ms against 3.7), so it would drag
            # the phase late. The phase moves to a step found outside it.
            self._step = due if on_beat else mid
            self._beats = 0
        else:
            self._step = due if on_beat else (lo + end) / 2
            self._beats += 1
        self._probe = self._beats >= PROBE_EVERY - 1 or not on_beat
        return True

    def _learn(self, now: float) -> None:
        self.state, self._steps, self._learn_until = "learning", [], now + LEARN_FOR_S
        self._changed_at = -math.inf

    def _off(self, now: float) -> None:
        self.state, self.beat_s = "off", None
        self._relearn_at = now + self._relearn_s
        self._relearn_s = min(RELEARN_MAX_S, 2 * self._relearn_s)
