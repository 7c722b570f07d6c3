"""orjson where it can, the standard library's meaning always."""

from __future__ import annotations

import json

import pytest

from app import jsonio


@pytest.mark.parametrize("raw", [
    b'{"a": 1, "b": [1.5, "x", null, true], "c": {"d": "\\u00e9"}}',
    b'{"x": NaN, "y": Infinity}',                   # not JSON, but json.loads reads it
    b'{"s": "\\ud800"}',                            # a lone surrogate
    b'{"a": 1, "a": 2}',
])
def test_loads_means_what_json_loads_means(raw: bytes) -> None:
    assert repr(jsonio.loads(raw)) == repr(json.loads(raw))


def test_loads_fails_like_json_loads() -> None:
    with pytest.raises(json.JSONDecodeError):
        jsonio.loads(b'{"a": ')


def test_dumps_round_trips_what_orjson_cannot_write() -> None:
    for obj in ({"a": [1, 2.5, "é"]}, {"s": "\ud800"}, {"big": 2**70}):
        assert json.loads(jsonio.dumps(obj)) == obj


@pytest.mark.parametrize("raw", [
    b'{"a": 1, "b": [1.5, "x", null, true], "c": {"d": "\\u00e9"}}',
    b'{"big": 123456789012345678901234567890, "neg": -9223372036854775809}',
    b'{"u64": 18446744073709551616, "f": 0.1234567890123456789012}',
    b'{"x": NaN, "y": Infinity, "z": 1e400}',
    b'{"s": "\\ud800"}',
    b'{"a": 1, "a": 2}',
])
def test_loads_exact_means_exactly_what_json_loads_means(raw: bytes) -> None:
    assert repr(jsonio.loads_exact(raw)) == repr(json.loads(raw))


@pytest.mark.parametrize("raw, error", [
    (b'{"a": ', json.JSONDecodeError),
    (b'{"a": "\xff"}', UnicodeDecodeError),
])
def test_loads_exact_fails_like_json_loads(raw: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        jsonio.loads_exact(raw)
    with pytest.raises(error):
        json.loads(raw)
