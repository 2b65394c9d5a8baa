"""utils/retry.py: tenacity's attempts, waits and stops as the two retry loops need them (no real sleep)."""

import pytest

from utils.retry import backoff


class Flaky:
    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise TimeoutError(f"failure {self.calls}")
        return "done"


def run(call, **settings):
    slept: list[float] = []
    for attempt in backoff(sleep=slept.append, **settings):
        with attempt:
            return call(), slept
    raise AssertionError("unreachable: tenacity raises or the block returns")


def test_waits_double_after_each_failure_until_an_attempt_succeeds():
    call = Flaky(2)
    assert run(call, attempts=3, backoff_s=0.5, retry_on=TimeoutError, affordable=lambda wait: True) == (
        "done", [0.5, 1.0])
    assert call.calls == 3


def test_the_last_failure_is_raised_when_the_attempts_run_out():
    call = Flaky(5)
    with pytest.raises(TimeoutError, match="failure 3"):
        run(call, attempts=3, backoff_s=0.1, retry_on=TimeoutError, affordable=lambda wait: True)
    assert call.calls == 3


def test_no_wait_the_deadline_cannot_afford_is_started():
    call, asked = Flaky(5), []
    with pytest.raises(TimeoutError, match="failure 2"):
        run(call, attempts=5, backoff_s=1.0, retry_on=TimeoutError,
            affordable=lambda wait: asked.append(wait) or wait < 2.0)
    assert call.calls == 2 and asked == [1.0, 2.0]


def test_an_error_not_worth_retrying_ends_at_once():
    calls = []

    def refused():
        calls.append(1)
        raise ValueError("refused")

    with pytest.raises(ValueError):
        run(refused, attempts=5, backoff_s=0.1, retry_on=TimeoutError, affordable=lambda wait: True)
    assert len(calls) == 1
