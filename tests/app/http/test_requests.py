"""Request bodies the gateway refuses before any work, with a message that
says what to do instead."""

from __future__ import annotations

import pytest

from app.errors import ApiError
from app.http.requests import validate_chat

MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("field", ["n", "n_cmpl"])
def test_more_than_one_choice_is_refused_with_what_to_do(field: str) -> None:
    with pytest.raises(ApiError) as caught:
        validate_chat({"model": "auto", "messages": MSG, field: 3})
    err = caught.value
    assert err.status == 400 and err.param == field
    assert "one choice per request" in err.message and "requests" in err.message


@pytest.mark.parametrize("value", [None, 1])
def test_one_choice_passes(value: int | None) -> None:
    body = {"model": "auto", "messages": MSG} | ({} if value is None else {"n": value})
    assert validate_chat(body).n == value


def test_zero_choices_are_refused() -> None:
    with pytest.raises(ApiError) as caught:
        validate_chat({"model": "auto", "messages": MSG, "n": 0})
    assert caught.value.status == 400 and caught.value.param == "n"
