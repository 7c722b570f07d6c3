"""Expected completion lengths are learned from traffic and survive a restart."""

from __future__ import annotations

from pathlib import Path

from app.routing import LengthBook
from router.decision import Decision


def decision(category: str, strategy: str = "direct", routed: bool = True) -> Decision:
    return Decision(tier="small", backend="b", strategy=strategy,  # type: ignore[arg-type]
                    max_tokens=100, thinking_budget=None, category=category, routed=routed)


def test_lengths_persist_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "state" / "lengths.json"
    book = LengthBook(path, save_every=5)
    for n in (10, 20, 30, 40, 50):
        book.observe(decision("chat"), n)
    assert path.exists()  # saved after save_every observations
    book.observe(decision("math", "cot"), 400)
    book.save()
    again = LengthBook(path)
    assert again.lengths.expected({"chat": 1.0}, "small:direct") == 30
    assert again.lengths.expected({"math": 1.0}, "small:cot") == 400


def test_forced_requests_and_unreadable_files_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "lengths.json"
    path.write_text("{not json")
    book = LengthBook(path)  # starts empty, does not fail
    book.observe(decision("chat", routed=False), 10)
    assert book.lengths.values == {}
