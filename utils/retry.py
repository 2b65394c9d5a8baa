"""Retries with exponential backoff that end at a deadline: tenacity, configured once for the OpenAI-compatible
backend (models/llm/openai.py) and the KG client (models/kg/client.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import tenacity


class _Unaffordable(tenacity.stop.stop_base):
    """Stops when the caller cannot afford the wait before the next attempt (tenacity computes it first)."""

    def __init__(self, affordable: Callable[[float], bool]) -> None:
        self.affordable = affordable

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return not self.affordable(retry_state.upcoming_sleep)


def backoff(attempts: int, backoff_s: float, retry_on: type[BaseException] | tuple[type[BaseException], ...],
            affordable: Callable[[float], bool], sleep: Callable[[float], None] = time.sleep,
            after: Callable[[tenacity.RetryCallState], None] | None = None) -> tenacity.Retrying:
    """At most `attempts` attempts of a block that raises `retry_on` when it failed in a way worth another try;
    after the k-th failure (k from 0) it waits backoff_s x 2^k, but only while `affordable(wait)` holds (the
    caller's deadline). The last failure is raised again; anything else a block raises ends the retries at once.
    `after` sees each failure worth another try, the last one included.

        for attempt in backoff(3, 0.5, TimeoutError, deadline.can_afford):
            with attempt:
                return call()
    """
    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts) | _Unaffordable(affordable),
        wait=tenacity.wait_exponential(multiplier=backoff_s, exp_base=2, min=0),
        retry=tenacity.retry_if_exception_type(retry_on), sleep=sleep, after=after or (lambda state: None),
        reraise=True)
