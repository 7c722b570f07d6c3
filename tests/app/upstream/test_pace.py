"""A replica's measured pace by batch size: a moving average per size, a
size not measured borrows the one just below it, a size further up counts
as too slow, old reports expire."""

from __future__ import annotations

from app.upstream.pace import MAX_AGE_S, SMOOTHING, UNKNOWN, Pace
from telemetry.timeline import TokenTimeline


def test_pace_averages_grows_one_size_at_a_time_and_expires() -> None:
    pace = Pace()
    assert pace.at(1, 0.0) is None  # a first request waits on nothing
    assert pace.at(2, 0.0) == UNKNOWN  # a batch never measured near: not packed blind
    pace.observe(2, 0.04, 0.0)
    assert pace.at(1, 0.0) is None
    assert pace.at(2, 0.0) == 0.04 and pace.at(3, 0.0) == 0.04  # 3 borrows 2
    assert pace.at(4, 0.0) == UNKNOWN  # two sizes above what was measured
    pace.observe(2, 0.08, 1.0)
    assert abs(pace.at(2, 1.0) - (0.04 + SMOOTHING * 0.04)) < 1e-12  # type: ignore[operator]
    pace.observe(4, 0.1, 2.0)
    assert pace.at(4, 2.0) == 0.1 and pace.at(5, 2.0) == 0.1 and pace.at(6, 2.0) == UNKNOWN
    later = 2.0 + MAX_AGE_S + 1
    assert pace.at(4, later) == UNKNOWN and pace.at(1, later) is None  # every report too old
    pace.observe(4, 0.02, later)  # an expired average restarts from the new report
    assert pace.at(4, later) == 0.02


def test_a_timeline_gives_the_pace_after_the_first_token() -> None:
    t = TokenTimeline(min_gap_s=0.0)
    t.mark(100, 0, 0.0)
    assert t.decode_s_per_token() is None  # nothing answered
    t.mark(100, 1, 0.5)  # the first token after 0.5 s of prefill
    for i in range(2, 12):
        t.mark(100, i, 0.5 + 0.05 * (i - 1))
    assert abs(t.decode_s_per_token() - 0.05) < 1e-9  # type: ignore[operator]
    assert t.decode_s_per_token(min_tokens=20) is None
    whole = TokenTimeline()
    whole.mark(100, 50, 1.0)  # an answer that came whole: no pace
    assert whole.decode_s_per_token() is None


def test_the_first_token_is_kept_though_close_marks_merge() -> None:
    """Tokens faster than the timeline's merge gap revise its last point; the
    pace still runs from the first answer token."""
    t = TokenTimeline(min_gap_s=0.02)
    for i in range(1, 32):
        t.mark(5, i, 0.001 * i)  # 31 tokens inside the first 20 ms: one merged point
    t.mark(5, 32, 0.0208)
    assert abs(t.decode_s_per_token() - (0.0208 - 0.001) / 31) < 1e-12  # type: ignore[operator]
