"""Scores: +1 correct, 0 miss ("i don't know"), -1 wrong (hallucination); unjudged counted on its own.

Rates are shares of all questions, so accuracy + hallucination + missing + unjudged = 1 and an unjudged
prediction lowers neither the score nor the hallucination rate.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from evaluation.judge import CORRECT, MISS, UNJUDGED, WRONG


@dataclass
class Scores:
    total: int
    correct: int
    miss: int
    wrong: int
    unjudged: int = 0

    @classmethod
    def of(cls, verdicts: list[str]) -> Scores:
        return cls(len(verdicts), verdicts.count(CORRECT), verdicts.count(MISS), verdicts.count(WRONG),
                   verdicts.count(UNJUDGED))

    def _rate(self, count: int) -> float:
        return count / self.total if self.total else 0.0

    @property
    def accuracy(self) -> float:
        return self._rate(self.correct)

    @property
    def hallucination(self) -> float:
        return self._rate(self.wrong)

    @property
    def missing(self) -> float:
        return self._rate(self.miss)

    @property
    def unjudged_rate(self) -> float:
        return self._rate(self.unjudged)

    @property
    def score(self) -> float:
        return self.accuracy - self.hallucination

    def as_dict(self) -> dict[str, float | int]:
        return {"total": self.total, "score": self.score, "accuracy": self.accuracy,
                "hallucination": self.hallucination, "missing": self.missing, "unjudged": self.unjudged_rate}


def latency(values: list[float]) -> dict[str, float]:
    """p50, p95 and max of `values` (seconds); zeros when there are none."""
    if not values:
        return {"p50": 0.0, "p95": 0.0, "max": 0.0, "n": 0}
    ordered = sorted(values)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank
    return {"p50": statistics.median(ordered), "p95": p95, "max": ordered[-1], "n": len(ordered)}
