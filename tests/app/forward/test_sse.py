"""SSE splitting keeps events byte-for-byte and handles chunk boundaries."""

from __future__ import annotations

from app.forward.sse import EventSplitter, event_json, is_done


def test_events_split_across_chunks_are_reassembled_unchanged() -> None:
    stream = b'data: {"a":1}\n\ndata: {"b":2}\r\n\r\ndata: [DONE]\n\n'
    for size in (1, 3, 7, len(stream)):
        s = EventSplitter()
        out = []
        for i in range(0, len(stream), size):
            out += s.feed(stream[i:i + size])
        assert b"".join(out) == stream
        assert [event_json(e) for e in out[:2]] == [{"a": 1}, {"b": 2}]
        assert is_done(out[2])


def test_junk_and_comments_are_not_json() -> None:
    assert event_json(b": keep-alive\n\n") is None
    assert event_json(b"data: {not json\n\n") is None
    assert event_json(b"data: [1]\n\n") is None
