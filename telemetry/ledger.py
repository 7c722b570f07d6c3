"""Attribution of one device's measured energy to the requests that ran on it.

The counter moves in steps (every ~100 ms on NVML). Each observed step is a
span [previous change, this change] whose energy is taken as spread evenly
over it, so a request shorter than a step gets its share of the step instead
of 0 J or a whole step. For every span:

    idle  = min(E, idle_power_w x duration)        -> the idle account
    net   = E - idle; of it, the requests overlapping the span take all but
            the background's share of the time no request covered (below),
            split among them by their marginal cost in it: the prompt and
            answer tokens each processed in the span (interpolated from its
            token timeline), priced by its backend's operating curve at its
            context length and the number of requests running together
            (telemetry.rates; without a curve: decode + w x prefill tokens);
            by overlap time when none did work yet. The rest, and a span no
            request overlaps, goes to the tail (unattributed) account.

The background is the net power of recent spans that no request overlapped,
more than BACKGROUND_AFTER_S after the last request ended (so not a
request's own ramp-down): load the requests did not cause (a neighbour's, on
a machine-wide estimate or RAPL; other GPU tenants). A request shorter than
a counter step takes the step's net energy less the background's for the
part of the step it did not cover, and never less than its covered share:
on an otherwise quiet device a short burst is charged in full (the counter
saw nothing else), under a steady neighbour's load it is not charged a whole
sample of that load.

A span is settled once every request overlapping it has closed (their token
timelines are complete), or `settle_lag_s` after it ended, using the progress
that the still-running requests have reported so far (a window opened with a
`progress` source, the gateway's live token timeline). A running request
without one (a remote gateway's, known only when it closes) holds a span
back for up to `blind_lag_s`, then counts no work in it. Either way the invariant holds exactly:
    attributed + idle + unattributed == measured.
A request's figure is final once a span ending after its close has settled.
Final figures are kept for lookups (GET /v1/energy/{id}) for `keep_results_s`
(10 minutes), at most the last `keep_results` (20,000), without their
timelines: memory stays flat however many requests pass.

A counter that cannot be read (failing or hanging reads: no reading for
`max_gap_s`, 30 s) can settle nothing: the stretch since its last change will
come back, if it does, as one span over the whole gap, which says nothing of
how its energy was spread. So the windows overlapping that stretch are given
up: their figures stay provisional (never final) and closed ones leave the
live set at once (checked as requests close, at most once a second), so
memory stays flat through an outage too; and the span that ends a gap is
booked as unattributed, not split among the few requests of its last
moments.

Cost: each counter step's settling costs O(windows live): requests running
plus those closed within the last lag. It runs on the sampler thread, or,
for a sample ingested with `defer` (few requests running: the gateway's
quiet rate), on whichever thread calls `settle_deferred` first (the event
loop's, as a request ends, after its response is out), else with the next
sample. A request's `close` is O(its points) and never attributes anything.

The idle baseline is configured or learned from quiet spans (no request for
`quiet_s`), and re-learned whenever the device is quiet again.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from telemetry.rates import TOKEN_COUNTS, TokenRates
from telemetry.timeline import EnergyFigure, Point
from telemetry.window import Window, WindowNames, covered_s, span_tokens

BACKGROUND_AFTER_S = 0.5  # a span this long after the last close shows background load
BACKGROUND_HALF_LIFE_S = 30.0
GIVE_UP_EVERY_S = 1.0  # at most this often, windows of an unread counter are given up


@dataclass(frozen=True)
class Totals:
    measured_j: float
    attributed_j: float
    idle_j: float
    unattributed_j: float
    idle_power_w: float | None
    power_w: float | None
    resets: int
    open_windows: int
    read_age_s: float | None = None  # since the counter's last reading (None: never read)
    given_up: int = 0  # windows no reading could settle (an unread counter): never final


class Ledger:
    """Thread-safe: the sampler thread ingests, request handlers open and close."""

    def __init__(
        self,
        source: str,
        prefill_weight: float = 0.1,
        idle_power_w: float | None = None,
        learn_idle: bool = True,
        quiet_s: float = 2.0,
        max_window_s: float = 3600.0,
        keep_results_s: float = 600.0,
        keep_results: int = 20_000,
        settle_lag_s: float = 1.0,
        blind_lag_s: float = 30.0,
        max_gap_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_final: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.source = source
        self._names = WindowNames()
        self._w = prefill_weight
        self._idle_w = idle_power_w
        self._learn_idle = learn_idle and idle_power_w is None
        self._quiet_s = quiet_s
        self._max_window_s = max_window_s
        self._keep_s = keep_results_s
        self._keep_n = keep_results  # finished figures kept for lookups: at most
        self._lag_s = settle_lag_s
        self._blind_lag_s = blind_lag_s
        self._max_gap_s = max_gap_s
        self.clock = clock
        # Called with the windows a counter step made final (their figures are
        # built only when asked for: `result`), on
        # the sampler thread, outside the lock.
        self.on_final = on_final
        self._lock = threading.Lock()
        self._open_count = 0
        # Windows still taking part in attribution, and finished ones kept for
        # lookups; only live ones are scanned per span (this runs 20x a second).
        self._live: dict[str, Window] = {}
        # Insertion order = order finalized. An OrderedDict: the oldest is
        # dropped as each one comes once 20,000 are kept, and a dict's first
        # item, behind the slots of those dropped, took a scan of up to tens
        # of thousands of them to find (~20 us a request here).
        self._done: OrderedDict[str, Window] = OrderedDict()
        self._pending: list[tuple[float, float, float]] = []  # (a, b, energy_j)
        self._deferred = False  # a sample's settling left to settle_deferred
        self._last_counter: float | None = None
        self._read_at: float | None = None  # clock time of the last reading
        self._started_at = clock()
        self._gave_up_at = float("-inf")  # when windows were last given up (unread counter)
        self._last_change_t: float | None = None
        self._last_close_t = float("-inf")
        self._power_w: float | None = None
        self._last_span: tuple[float, float, float] | None = None
        self._quiet_j = 0.0
        self._quiet_s_sum = 0.0
        # The newest span's work per second (in its windows' units) and batch
        # sizes: what a closing request's provisional share is weighed by.
        self._work: tuple[float, Counter[TokenRates]] = (0.0, Counter())
        self._background_j = 0.0  # decayed sums over window-free spans (see above)
        self._background_s = 0.0
        self.measured_j = 0.0
        self.attributed_j = 0.0
        self.idle_j = 0.0
        self.unattributed_j = 0.0
        self.resets = 0
        self.given_up = 0

    # -- sampler side ---------------------------------------------------
    def ingest(self, t: float, counter_j: float, power_w: float | None = None,
               now: float | None = None, defer: bool = False) -> None:
        """One sample of the counter, which reached `counter_j` at `t` (its
        step's time, where the sampler knows it better than `now`, the read's);
        a change closes a span. `defer`: leave the settling to the next
        `settle_deferred` call (the event loop's, as a request ends), unless
        the last sample's is still left (then both are settled now) or no
        window is live (nothing to attribute: settled now, so the books
        balance whenever no request is in flight)."""
        now = t if now is None else now
        with self._lock:
            unread_s = self._unread_s(now)
            self._read_at = now
            if power_w is not None:
                self._power_w = power_w
            if self._last_counter is None or self._last_change_t is None:
                self._last_counter, self._last_change_t = counter_j, t
                return
            delta = counter_j - self._last_counter
            if delta < 0:  # counter reset (driver reload): that stretch is lost
                self.resets += 1
                self._last_counter, self._last_change_t = counter_j, t
                return
            if delta == 0 or t <= self._last_change_t:
                return
            self.measured_j += delta
            finals = []
            if unread_s > self._max_gap_s:  # a span across a gap in the readings
                finals = self._settle(now) + self._give_up()
                idle = min(delta, (self._idle_w or 0.0) * (t - self._last_change_t))
                self.idle_j += idle
                self.unattributed_j += delta - idle
            else:
                self._pending.append((self._last_change_t, t, delta))
                self._last_span = (self._last_change_t, t, delta)
                self._note_work(self._last_change_t, t, now)
            self._last_counter, self._last_change_t = counter_j, t
            self._expire(now)
            if defer and self._live and not self._deferred and not finals:
                self._deferred = True  # (with no window live there is nothing to wait for)
                return
            self._deferred = False
            finals += self._settle(now)
        if self.on_final is not None and finals:
            self.on_final(finals)

    def settle_deferred(self) -> None:
        """Settle what a deferred sample left (nothing, cheaply, when none did)."""
        if not self._deferred:  # read without the lock: a stale answer costs one call
            return
        with self._lock:
            if not self._deferred:
                return
            self._deferred = False
            finals = self._settle(self.clock())
        if self.on_final is not None and finals:
            self.on_final(finals)

    # -- request side ---------------------------------------------------
    def open(self, progress: Callable[[int], list[Point]] | None = None,
             rates: TokenRates = TOKEN_COUNTS) -> str:
        """A new window; `progress` (optional) returns the request's token points
        from an index on, read by the sampler thread while the request runs;
        `rates`: its backend's marginal token costs. Ids cannot be guessed
        (WindowNames)."""
        with self._lock:
            wid = self._names.next()
            self._add(wid, progress, rates)
            return wid

    def open_named(self, wid: str, rates: TokenRates = TOKEN_COUNTS) -> bool:
        """A new window named by the caller (a gateway names its windows so
        that it need not wait for them to open); False if the name is taken."""
        with self._lock:
            if wid in self._live or wid in self._done:
                return False
            self._add(wid, None, rates)
            return True

    def _add(self, wid: str, progress: Callable[[int], list[Point]] | None,
             rates: TokenRates) -> None:
        self._live[wid] = Window(wid, self.clock(), progress=progress, rates=rates)
        self._open_count += 1

    def close(self, wid: str, points: list[Point]) -> EnergyFigure | None:
        """Close a window with its token timeline; returns the provisional figure.
        O(points): the spans it took part in are settled by the sampler thread."""
        with self._lock:
            win = self._live.get(wid)
            if win is None or win.closed_at is not None:
                return None
            now = self.clock()
            win.closed_at = now
            win.progress = None
            self._open_count -= 1
            win.others_until = float("inf") if self._open_count else self._last_close_t
            self._last_close_t = now
            win.times.clear()
            win.prompt.clear()
            win.decode.clear()
            win.add_points(sorted(points), now)
            figure = self._figure(win, provisional=True)
            finals = self._give_up_if_unread(now)
        if self.on_final is not None and finals:
            self.on_final(finals)
        return figure

    def abandon(self, wid: str) -> None:
        """Drop a window that never reached a worker; it did no work."""
        self.close(wid, [])

    def result(self, wid: str) -> EnergyFigure | None:
        with self._lock:
            win = self._live.get(wid) or self._done.get(wid)
            return None if win is None else self._figure(win, provisional=not win.final)

    def is_open(self, wid: str) -> bool:
        """Whether the window is open (not closed, nor expired)."""
        with self._lock:
            win = self._live.get(wid)
            return win is not None and win.closed_at is None

    def open_for_s(self, wid: str) -> float:
        """How long the window has been open (0 if it is not known)."""
        with self._lock:
            win = self._live.get(wid)
            return 0.0 if win is None else self.clock() - win.opened_at

    def waiting(self, wid: str) -> bool:
        """Whether the window is known and its figure not final yet."""
        with self._lock:
            win = self._live.get(wid)
            return win is not None and not win.final and not win.lost

    @property
    def live_windows(self) -> int:
        """Windows held for attribution: running, or closed and not final yet."""
        return len(self._live)

    def totals(self) -> Totals:
        with self._lock:
            return Totals(
                self.measured_j, self.attributed_j, self.idle_j, self.unattributed_j,
                self._idle_w, self._power_w, self.resets,
                self._open_count,
                None if self._read_at is None else max(0.0, self.clock() - self._read_at),
                self.given_up,
            )

    @property
    def open_windows(self) -> int:
        return self._open_count

    @property
    def idle_power_w(self) -> float | None:
        return self._idle_w

    @property
    def last_counter_j(self) -> float | None:
        """The counter value of the last sample ingested."""
        with self._lock:
            return self._last_counter

    @property
    def prefill_weight(self) -> float:
        return self._w

    @prefill_weight.setter
    def prefill_weight(self, w: float) -> None:
        """Set from calibration; applies to spans settled from now on (windows
        without a curve)."""
        with self._lock:
            self._w = w

    # -- attribution ----------------------------------------------------
    def _settle(self, now: float) -> list[str]:
        """Settle pending spans in order; returns the windows whose figures
        will not change now (final, or lost)."""
        finals: list[str] = []
        while self._pending:
            a, b, energy = self._pending[0]
            wins = self._overlapping(a, b)
            running = [w for w in wins if w.closed_at is None]
            blind = any(w.progress is None for w in running)
            if running and now - b < (self._blind_lag_s if blind else self._lag_s):
                break
            for w in running:
                w.sync(now)
            self._pending.pop(0)
            self._attribute(a, b, energy, wins)
            for w in wins:
                if w.closed_at is not None and w.settled_until >= w.closed_at:
                    self._retire(w)  # final, or lost: its figure will not change
                    finals.append(w.wid)
        return finals

    def _retire(self, w: Window) -> None:
        """A window whose figure will not change leaves the live set (kept for
        lookups without its timeline; a lost one's provisional figure kept)."""
        if w.lost:
            w.figure = self._figure(w, provisional=True)
        w.compact()
        self._done[w.wid] = self._live.pop(w.wid)

    def _attribute(self, a: float, b: float, energy: float, wins: list[Window]) -> None:
        """Split one span among the windows overlapping it, and book it."""
        idle_w = self._idle_w or 0.0
        idle = min(energy, idle_w * (b - a))
        net = energy - idle
        if not wins:
            self._learn_background(a, b, net)
        attributable = self._attributable(a, b, net, wins)
        works, total, _ = self._works(a, b, wins)
        overlaps = [w.overlap_s(a, b) for w in wins]
        overlap_total = sum(overlaps)
        idle_per_s = idle / (b - a) / len(wins) if wins else 0.0
        attributed = 0.0
        for (w, work, pre), overlap in zip(works, overlaps, strict=True):
            if total > 0:
                f = work / total
            elif overlap_total > 0:
                f = overlap / overlap_total
            else:
                f = 0.0
            share = attributable * f
            attributed += share
            w.net_j += share
            pre_f = pre / work if work > 0 else 0.0
            w.prefill_j += share * pre_f
            w.decode_j += share * (1 - pre_f)
            w.idle_share_j += idle_per_s * overlap
            w.settled_until = b
        self.attributed_j += attributed
        self.idle_j += idle
        self.unattributed_j += net - attributed
        self._learn(a, b, energy, wins)

    def _works(self, a: float, b: float, wins: list[Window]
               ) -> tuple[list[tuple[Window, float, float]], float, Counter[TokenRates]]:
        """Each window's work in [a, b] (and the prefill part of it), their
        sum, and the batch sizes: requests of one backend doing work in the
        span (the curve's n)."""
        spans = [(w, *span_tokens(w, a, b)) for w in wins]
        batch = Counter(w.rates for w, dp, dd, _ in spans if dp + dd > 0)
        works = []
        total = 0.0
        for w, dp, dd, context in spans:
            if dp + dd <= 0:  # no token in the span (most windows, most steps)
                works.append((w, 0.0, 0.0))
                continue
            n = batch[w.rates]
            pre = dp * w.rates.prefill_rate(n, self._w)
            work = pre + dd * w.rates.decode_rate(context, n)
            works.append((w, work, pre))
            total += work
        return works, total, batch

    def _overlapping(self, a: float, b: float) -> list[Window]:
        """The live windows overlapping [a, b] (Window.overlaps, inlined: this
        runs for every live window per step)."""
        return [w for w in self._live.values()
                if w.opened_at < b and (w.closed_at is None or w.closed_at > a)]

    def _note_work(self, a: float, b: float, now: float) -> None:
        """The newest span's work per second, its requests' progress read now:
        what a request closing before the span settles weighs its share of the
        unsettled stretch against. (A settled span's is a second old under
        load, and a burst's requests that end within its first second were
        weighed against the quiet before it: evenly.) O(live windows), and
        skipped while fewer than two requests run: the share is then a lone
        request's whole stretch, or weighed by the work when two last ran
        together (at one connection, 20 requests a 10 ms span of the CPU
        estimate, it cost 6 us a window, +8% CPU a request)."""
        if self._open_count < 2:
            return
        wins = self._overlapping(a, b)
        for w in wins:
            w.sync(now)
        _, total, batch = self._works(a, b, wins)
        self._work = (total / (b - a), batch)

    def _attributable(self, a: float, b: float, net: float, wins: list[Window]) -> float:
        """The part of a span's net energy its requests take: all but the
        background's power over the time none of them covered, at least their
        covered share."""
        if not wins or net <= 0:
            return 0.0 if not wins else net
        covered = covered_s(wins, a, b)
        uncovered = (b - a) - covered
        if uncovered <= 0 or self._background_s <= 0:
            return net
        background_w = max(0.0, self._background_j / self._background_s)
        return min(net, max(net * covered / (b - a), net - background_w * uncovered))

    def _learn_background(self, a: float, b: float, net: float) -> None:
        if a - self._last_close_t < BACKGROUND_AFTER_S:
            return  # a request's own tail
        decay = 0.5 ** ((b - a) / BACKGROUND_HALF_LIFE_S)
        self._background_j = self._background_j * decay + net  # signed: jitter averages out
        self._background_s = self._background_s * decay + (b - a)

    def _learn(self, a: float, b: float, energy: float, wins: list[Window]) -> None:
        """Refresh the idle baseline from spans long after the last request."""
        if not self._learn_idle or wins or a - self._last_close_t < self._quiet_s:
            return
        # A running mean over the recent quiet stretch (decays so it tracks drift).
        decay = 0.5 ** ((b - a) / 30.0)
        self._quiet_j = self._quiet_j * decay + energy
        self._quiet_s_sum = self._quiet_s_sum * decay + (b - a)
        if self._quiet_s_sum >= 1.0:
            self._idle_w = self._quiet_j / self._quiet_s_sum

    def _figure(self, win: Window, provisional: bool) -> EnergyFigure:
        if win.figure is not None:
            return win.figure
        net, gross = win.net_j, win.net_j + win.idle_share_j
        if provisional and win.closed_at is not None:
            extra, idle_extra = self._estimate_unsettled(win)
            net += extra
            gross += extra + idle_extra
        return EnergyFigure(
            net_j=net, gross_j=gross, source=self.source, final=win.final,
            prefill_j=win.prefill_j, decode_j=win.decode_j, standalone_j=win.standalone_j(),
        )

    def _estimate_unsettled(self, win: Window) -> tuple[float, float]:
        """Net joules not yet settled, and the idle share of that stretch,
        estimated in O(pending spans), which the settle lag bounds: the
        pending spans' net energy over the window (all that the final figure
        will take of a span, where no other request ran in it), then the
        stretch since the last step at the latest span's net power (for a
        request that began inside that span or after it, its curve's net
        estimate for its tokens in the stretch where that is more: the span's
        power may be the quiet before it); of it, the request's share of the
        work: all of it when no other request ran in the stretch, else its
        own tokens in the stretch against the work per second of the newest
        span (evenly with the requests running now when that says nothing).
        A request charged nothing yet, for which that comes to nothing too (a
        quiet device: no step has seen it, or the steps that did saw idle
        power), gets its curve's estimate instead (with a curve)."""
        assert win.closed_at is not None
        idle_w = self._idle_w or 0.0
        start = end = max(win.settled_until, win.opened_at)
        stretch_s = max(0.0, win.closed_at - start)
        idle_extra = idle_w * stretch_s / (1 + self._open_count)
        extra = 0.0
        alone = win.others_until <= start
        for a, b, energy in self._pending:
            if b <= end or a >= win.closed_at:
                continue
            if alone:  # the span is its own: what the final figure will take of it
                net = energy - min(energy, idle_w * (b - a))
                extra += self._attributable(a, b, net, [win])
            else:
                net_w = max(0.0, energy / (b - a) - idle_w)
                extra += net_w * win.overlap_s(max(a, end), b)
            end = b
        tail = curve_tail = 0.0
        if win.closed_at > end and self._last_span is not None:
            a, b, energy = self._last_span
            tail = max(0.0, energy / (b - a) - idle_w) * (win.closed_at - end)
            if win.opened_at > a and win.rates.coef is not None:
                # it began inside the last span or after it: that span's power
                # may be the quiet before it, not its own running; its curve's
                # net for its tokens there, where that says more
                curve_tail = self._curve_net(win, end, win.closed_at - end, idle_w)
        share = 1.0 if alone else self._work_share(win, start, stretch_s)
        estimate = extra * share + max(tail * share, curve_tail)
        if estimate < 1e-6 and win.net_j < 1e-6 and win.rates.coef is not None:
            # The spans said nothing of it yet (a quiet device: 0 J).
            estimate = self._curve_net(win, start, stretch_s, idle_w)
        return estimate, idle_extra

    def _curve_net(self, win: Window, start: float, stretch_s: float, idle_w: float) -> float:
        """Net joules of the request's tokens since `start` by its curve: their
        marginal cost beside the requests running, less their share of idle."""
        dp, dd, context = span_tokens(win, start, win.closed_at or start)
        n = 1 + self._open_count
        gross = dp * win.rates.prefill_rate(n, self._w) + dd * win.rates.decode_rate(context, n)
        return max(0.0, gross - idle_w * stretch_s / n)

    def _work_share(self, win: Window, start: float, stretch_s: float) -> float:
        rate, batch = self._work
        even = 1.0 / (1 + self._open_count)
        if stretch_s <= 0 or rate <= 0:
            return even
        dp, dd, context = span_tokens(win, start, win.closed_at or start)
        n = max(1, batch.get(win.rates, 1))
        mine = dp * win.rates.prefill_rate(n, self._w) + dd * win.rates.decode_rate(context, n)
        if mine <= 0:
            return even
        return min(1.0, mine / max(mine, rate * stretch_s))

    def _unread_s(self, now: float) -> float:
        """How long the counter has gone unread (since the ledger began, if never)."""
        return now - (self._started_at if self._read_at is None else self._read_at)

    def _give_up_if_unread(self, now: float) -> list[str]:
        """No reading for `max_gap_s`: settle what can be, give up the rest
        (at most once a second; O(live windows)). Returns the windows whose
        figures will not change."""
        if self._unread_s(now) <= self._max_gap_s or now - self._gave_up_at < GIVE_UP_EVERY_S:
            return []
        self._gave_up_at = now
        return self._settle(now) + self._give_up()

    def _give_up(self) -> list[str]:
        """The live windows (pending spans settled: they all overlap the
        stretch no reading covers) are never final; closed ones are retired."""
        retired = []
        for w in list(self._live.values()):
            if not w.lost:
                self.given_up += 1
            w.lost = True
            if w.closed_at is not None:
                self._retire(w)
                retired.append(w.wid)
        return retired

    def _expire(self, now: float) -> None:
        for w in list(self._live.values()):
            if w.closed_at is None and now - w.opened_at > self._max_window_s:
                w.closed_at = now  # leaked window: closed with no work
                w.progress = None
                self._open_count -= 1
            elif w.closed_at is not None and now - w.closed_at > self._keep_s:
                w.compact()
                self._done[w.wid] = self._live.pop(w.wid)  # never final (counter reset)
        while self._done:
            w = next(iter(self._done.values()))
            recent = w.closed_at is not None and now - w.closed_at <= self._keep_s
            if recent and len(self._done) <= self._keep_n:
                break
            self._done.popitem(last=False)
