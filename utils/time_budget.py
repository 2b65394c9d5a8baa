"""Deadline: the wall-clock end of one batch, shared by every stage and backend so that none overruns it.

How a batch's seconds are shared among the stages: docs/decisions/time-budget.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Deadline:
    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._end = clock() + seconds
        self.total = seconds

    @classmethod
    def for_batch(cls, batch_size: int, per_query_s: float, safety_margin_s: float,
                  clock: Callable[[], float] = time.monotonic) -> Deadline:
        """The grader allows batch_size x per-query seconds; keep a margin for returning."""
        return cls(batch_size * per_query_s - safety_margin_s, clock)

    def remaining(self) -> float:
        return max(0.0, self._end - self._clock())

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def can_afford(self, seconds: float) -> bool:
        return self.remaining() >= seconds

    def reserve(self, seconds: float) -> Deadline:
        """A deadline `seconds` earlier than this one, to keep time for what must run after."""
        return self._ending(self._end - seconds)

    def capped(self, seconds: float) -> Deadline:
        """This deadline, or `seconds` from now if that comes first."""
        return self._ending(min(self._end, self._clock() + seconds))

    def _ending(self, end: float) -> Deadline:
        other = Deadline.__new__(Deadline)
        other._clock, other._end, other.total = self._clock, end, self.total
        return other
