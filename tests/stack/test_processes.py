"""wait_until: what a polled check's value and exceptions do (no component involved)."""

from __future__ import annotations

import time

import pytest

from stack.processes import free_ports, port_in_use, wait_until
from stack.transient import STARTING


def test_the_first_truthy_value_is_returned() -> None:
    values = iter([None, 0, [], {"rows": 3}])
    assert wait_until(lambda: next(values), 5, "a value", interval=0.01) == {"rows": 3}


def test_an_assertion_in_the_check_fails_at_once_with_its_own_message() -> None:
    calls = 0

    def check() -> bool:
        nonlocal calls
        calls += 1
        assert calls < 2, "the answer went backwards"
        return False

    started = time.monotonic()
    with pytest.raises(AssertionError, match="the answer went backwards"):
        wait_until(check, 30, "an answer", interval=0.01, transient=(Exception,))
    assert time.monotonic() - started < 1.0
    assert calls == 2


def test_an_error_not_declared_transient_propagates_at_once() -> None:
    def check() -> bool:
        raise KeyError("no such column")

    started = time.monotonic()
    with pytest.raises(KeyError, match="no such column"):
        wait_until(check, 30, "a column", transient=STARTING)
    assert time.monotonic() - started < 1.0


def test_a_transient_error_is_retried_until_the_check_holds() -> None:
    outcomes = iter([ConnectionRefusedError(), ConnectionResetError(), False, "up"])

    def check() -> object:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert wait_until(check, 5, "a server", interval=0.01, transient=STARTING) == "up"


class _Falsy:
    """A value a check returns that does not satisfy the wait, with a long repr."""

    def __init__(self, poll: int) -> None:
        self.poll = poll

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"_Falsy(poll={self.poll}, rows={list(range(500))})"


def test_on_expiry_the_last_value_and_the_last_transient_error_are_reported() -> None:
    polls = 0

    def check() -> _Falsy:
        nonlocal polls
        polls += 1
        if polls % 2:
            raise ConnectionRefusedError(f"refused at poll {polls}")
        return _Falsy(polls)

    started = time.monotonic()
    with pytest.raises(TimeoutError) as caught:
        wait_until(check, 0.5, "a server", interval=0.01, transient=STARTING)
    assert 0.5 <= time.monotonic() - started < 2.0
    message = str(caught.value)
    assert message.startswith("timed out after 0.5 s waiting for a server; last value: _Falsy(")
    assert len(message) < 500  # the repr is cut
    assert polls > 2
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)
    assert "refused at poll" in str(caught.value.__cause__)


def test_a_check_that_only_ever_raised_says_so_on_expiry() -> None:
    def check() -> bool:
        raise ConnectionRefusedError("nothing listens")

    with pytest.raises(TimeoutError, match="last value: none") as caught:
        wait_until(check, 0.2, "a server", interval=0.01, transient=STARTING)
    assert str(caught.value.__cause__) == "nothing listens"


def test_free_ports_are_distinct_and_free() -> None:
    """Many ports at once never repeat one (free_port alone may: a released port can be
    handed out again; the Prometheus bench once got a target port twice)."""
    ports = free_ports(200)
    assert len(set(ports)) == 200
    assert not any(port_in_use("127.0.0.1", p) for p in ports)
