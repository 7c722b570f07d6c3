"""The usage ledger: rows written in batches off the request path, budgets per
period from memory, everything back after a reopen."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from app.tenancy.keys import ApiKey
from app.tenancy.spend import SpendLedger, UsageRow, period_end, period_start

KEY = ApiKey("k1", "team-a", "h", 0.0, joule_budget=10.0, budget_period="day")


def row(t: float, joules: float, key: str | None = "k1", backend: str = "small") -> UsageRow:
    return UsageRow(t, key, "team-a" if key else None, "auto", "small", backend, "direct",
                    "chat", "ok", 10, 5, joules, joules + 1.0, "nvml", 0.01)


def test_spend_counts_before_and_after_the_rows_are_written(database: str) -> None:
    now = time.time()
    ledger = SpendLedger(database, flush_s=0.05)
    assert ledger.spent_j(KEY) == 0.0
    ledger.record(row(now, 3.0))
    ledger.record(row(now, 4.0))
    ledger.record(row(period_start("day", now) - 1, 100.0))  # the previous day
    ledger.record(row(now, 50.0, key=None))  # an open gateway's request
    assert ledger.spent_j(KEY) == 7.0  # unwritten rows count at once
    ledger.close()
    unprimed = SpendLedger(database)  # asked first: loaded on its writer thread
    deadline = time.monotonic() + 5
    while unprimed.spent_j(KEY) != 7.0:
        assert time.monotonic() < deadline, "spend never loaded"
        time.sleep(0.01)
    unprimed.close()
    reopened = SpendLedger(database)
    reopened.prime([KEY])  # as a gateway does at start-up
    assert reopened.spent_j(KEY) == 7.0
    rows = reopened.rows("k1", period_start("day", now))
    assert [r["energy_net_j"] for r in rows] == [3.0, 4.0]
    assert len(reopened.rows(None, 0.0)) == 4
    assert [r["energy_net_j"] for r in reopened.rows(None, 0.0, limit=2)] == [4.0, 50.0]
    totals = reopened.totals("k1", period_start("day", now))
    assert totals["totals"] == {"requests": 2, "prompt_tokens": 20, "cached_tokens": 0,
                                "completion_tokens": 10,
                                "energy_net_j": 7.0, "saved_expected_j": 0.0}
    assert list(totals["by_model"]) == ["small"]
    day = time.strftime("%Y-%m-%d", time.gmtime(now))
    assert totals["by_day"] == {day: totals["totals"]}
    everyone = reopened.totals(None, 0.0)
    assert everyone["totals"]["requests"] == 4 and len(everyone["by_day"]) == 2
    assert everyone["totals"]["energy_net_j"] == 157.0
    assert reopened.totals(None, 0.0, key_name="team-a")["totals"]["requests"] == 3
    reopened.close()


def test_periods_hold_now() -> None:
    now = time.time()
    for p in ("day", "week", "month"):
        assert period_start(p, now) <= now < period_end(p, now)  # type: ignore[arg-type]


def test_rows_the_database_refuses_are_written_once_it_takes_them(database: str) -> None:
    from app.tenancy.database import Database

    other = Database(database)  # another client: takes the table away, then back
    ledger = SpendLedger(database, flush_s=0.05)
    other.execute("ALTER TABLE usage RENAME TO usage_away")
    now = time.time()
    for i in range(5):
        ledger.record(row(now + i, 1.0))
    time.sleep(0.5)  # several refused attempts
    assert ledger.spent_j(KEY) == 5.0  # still counted against the budget
    other.execute("ALTER TABLE usage_away RENAME TO usage")
    deadline = time.monotonic() + 5
    while other.execute("SELECT COUNT(*) FROM usage").rows[0][0] < 5:
        assert time.monotonic() < deadline, "rows never written"
        time.sleep(0.05)
    ledger.close()
    times = [r[0] for r in other.execute("SELECT time FROM usage ORDER BY time").rows]
    assert times == [now + i for i in range(5)]  # in order, each once
    other.close()


def test_a_row_with_its_final_figure_differs_from_it_in_the_figure_only() -> None:
    r = replace(row(1_700_000_000.0, 2.0), request_id="r1", model="auto", saved_j=1.5,
                cached_tokens=3, energy_final=False)
    assert r.with_figure(1.0, 4.0, "nvml", True) == replace(
        r, energy_net_j=1.0, energy_gross_j=4.0, source="nvml", energy_final=True)


def test_a_key_whose_spend_cannot_be_loaded_is_counted_in_memory(database: str) -> None:
    """The database down: a key not loaded yet is tried once, then counts what
    this gateway recorded from memory (not a scan of the rows waiting on
    every request: 13 ms each with 200,000 of them), and is loaded again
    once the database answers."""
    from app.tenancy.database import Database

    other = Database(database)
    ledger = SpendLedger(database, flush_s=0.05)
    other.execute("ALTER TABLE usage RENAME TO usage_away")
    now = time.time()
    for _ in range(200):
        ledger.record(row(now, 0.01))
    scans = 0
    scan = ledger._pending

    def counted(key_id: str, start: float) -> float:
        nonlocal scans
        scans += 1
        return scan(key_id, start)

    ledger._pending = counted  # type: ignore[method-assign]
    assert abs(ledger.spent_j(KEY) - 2.0) < 1e-9  # what is known, at once
    deadline = time.monotonic() + 5
    while KEY.id not in ledger._unloaded:  # the writer tried to load it, and could not
        assert time.monotonic() < deadline, "never tried"
        time.sleep(0.01)
    scans = 0
    for _ in range(100):
        assert abs(ledger.spent_j(KEY) - 2.0) < 1e-9
    ledger.record(row(now, 1.0))
    assert abs(ledger.spent_j(KEY) - 3.0) < 1e-9
    assert scans == 0
    other.execute("ALTER TABLE usage_away RENAME TO usage")
    other.execute("INSERT INTO usage (time, key_id, route, tier, backend, strategy, category,"
                  " status, prompt_tokens, completion_tokens, energy_net_j, source, latency_s)"
                  f" VALUES ({now}, 'k1', 'auto', 'small', 'small', 'direct', 'chat', 'ok',"
                  " 1, 1, 5.0, 'nvml', 0.1)")  # another gateway's row, committed
    deadline = time.monotonic() + 5
    while KEY.id in ledger._unloaded:
        assert time.monotonic() < deadline, "never loaded"
        time.sleep(0.01)
    assert abs(ledger.spent_j(KEY) - 8.0) < 1e-9  # committed rows now count too
    ledger.close()
    other.close()


def test_rows_beyond_the_memory_bound_wait_in_the_journal(
        database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database down for long: past MAX_UNWRITTEN rows the oldest leave
    memory (memory stays bounded); the journal keeps them, and once the
    database is back they are read from it and written, each once, with the
    rest, while requests go on; a next start finds nothing left to write."""
    from app.tenancy import spend
    from app.tenancy.database import Database

    monkeypatch.setattr(spend, "MAX_UNWRITTEN", 60)
    monkeypatch.setattr(spend, "DROP_CHUNK", 20)
    other = Database(database)
    journal = tmp_path / "journal"
    ledger = SpendLedger(database, flush_s=0.05, batch=10, journal=journal)
    other.execute("ALTER TABLE usage RENAME TO usage_away")
    now = time.time()
    for i in range(150):
        r = replace(row(now + i, 1.0), request_id=f"r{i}")
        ledger.answered(r)
        ledger.record(r)
    assert len(ledger._unwritten) <= 61 and ledger.dropped >= 80
    assert ledger._journal is not None and len(ledger._journal._where) <= 61  # bounded too
    other.execute("ALTER TABLE usage_away RENAME TO usage")
    for i in range(150, 200):  # requests go on while it catches up
        r = replace(row(now + i, 1.0), request_id=f"r{i}")
        ledger.answered(r)
        ledger.record(r)
        time.sleep(0.002)
    deadline = time.monotonic() + 10
    while other.execute("SELECT COUNT(*) FROM usage").rows[0][0] < 200:
        assert time.monotonic() < deadline, "rows left to the journal never written"
        time.sleep(0.02)
    ledger.close()
    SpendLedger(database, journal=journal).close()  # the next start: nothing left
    ids = [r[0] for r in other.execute("SELECT request_id FROM usage").rows]
    assert sorted(ids) == sorted(f"r{i}" for i in range(200))
    assert not list(journal.glob("*.jsonl"))  # every row committed: segments gone
    other.close()
