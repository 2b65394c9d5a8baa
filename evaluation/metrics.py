"""Scores: +1 correct, 0 miss ("i don't know"), -1 wrong (hallucination); unjudged counted on its own.

Rates are shares of all questions, so accuracy + hallucination + missing + unjudged = 1 and an unjudged
prediction lowers neither the score nor the hallucination rate; `score_range` is where the score would lie if
every unjudged prediction were wrong, or every one correct. `intervals` gives bootstrap 95% intervals,
`paired_difference` the difference of two runs' scores with its paired interval, `risk_coverage` the curve of
answers taken best first. The statistics of the harness are here, and this module renders nothing.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import bootstrap

from evaluation.verdicts import CORRECT, MISS, UNJUDGED, WRONG


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

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "score": self.score, "accuracy": self.accuracy,
                "hallucination": self.hallucination, "missing": self.missing, "unjudged": self.unjudged_rate,
                "score_range": [self.score - self.unjudged_rate, self.score + self.unjudged_rate]}


MIN_FOR_INTERVAL = 10  # under this many questions an interval says nothing a reader can act on
RESAMPLES = 2000


def intervals(verdicts: list[str], seed: int = 0) -> dict[str, list[float]] | None:
    """Bootstrap 95% percentile intervals (scipy.stats.bootstrap, questions resampled with their verdicts) of the
    score, accuracy and hallucination rate; None under MIN_FOR_INTERVAL questions. A fixed seed: the same
    verdicts give the same interval in every report."""
    if len(verdicts) < MIN_FOR_INTERVAL:
        return None
    correct = np.array([v == CORRECT for v in verdicts], dtype=float)
    wrong = np.array([v == WRONG for v in verdicts], dtype=float)
    result = bootstrap((correct, wrong), lambda c, w, axis: np.stack([c.mean(axis) - w.mean(axis), c.mean(axis),
                                                                      w.mean(axis)]),
                       paired=True, vectorized=True, method="percentile", n_resamples=RESAMPLES,
                       random_state=np.random.default_rng(seed))  # one call: the three share their resamples
    low, high = (np.asarray(bound) for bound in result.confidence_interval)  # one value per statistic
    return {name: [float(low[i]), float(high[i])] for i, name in enumerate(("score", "accuracy", "hallucination"))}


def latency(values: list[float]) -> dict[str, float]:
    """p50, p95 and max of `values` (seconds); zeros when there are none."""
    if not values:
        return {"p50": 0.0, "p95": 0.0, "max": 0.0, "n": 0}
    ordered = sorted(values)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank
    return {"p50": statistics.median(ordered), "p95": p95, "max": ordered[-1], "n": len(ordered)}


POINTS = {CORRECT: 1, MISS: 0, WRONG: -1}


def paired_difference(a: list[str], b: list[str], seed: int = 0) -> dict[str, Any]:
    """Score of B minus score of A over the questions judged in both, with its paired bootstrap 95% interval
    (None under MIN_FOR_INTERVAL questions)."""
    pairs = [(POINTS[x], POINTS[y]) for x, y in zip(a, b) if x != UNJUDGED and y != UNJUDGED]
    differences = np.array([y - x for x, y in pairs], dtype=float)
    result: dict[str, Any] = {"questions": len(pairs), "unjudged_left_out": len(a) - len(pairs),
                              "score_a": float(np.mean([x for x, _ in pairs])) if pairs else 0.0,
                              "score_b": float(np.mean([y for _, y in pairs])) if pairs else 0.0,
                              "difference": float(differences.mean()) if pairs else 0.0, "ci95": None}
    if len(pairs) >= MIN_FOR_INTERVAL:
        result["ci95"] = mean_interval(differences, seed)
    return result


def mean_interval(values: np.ndarray, seed: int = 0) -> list[float]:
    """The percentile bootstrap 95% interval of the mean of paired `values` (one a question)."""
    if np.all(values == values[0]):  # every question the same: the interval is the point
        return [float(values[0]), float(values[0])]
    found = bootstrap((values,), np.mean, vectorized=True, method="percentile", n_resamples=RESAMPLES,
                      random_state=np.random.default_rng(seed))
    return [float(found.confidence_interval.low), float(found.confidence_interval.high)]


CURVE_POINTS = 25  # the risk-coverage curve's points in report.json (evenly spaced over the answers)


def risk_coverage(scored: list[tuple[float, str]], questions: int) -> list[dict[str, float]]:
    """The answers (P(correct), verdict: correct or wrong) answered best first: at each point, the share of the
    `questions` answered, the accuracy of those answered, the CRAG score of answering only them, and the lowest P
    among them (a threshold just under it answers exactly these)."""
    ordered = sorted(scored, key=lambda item: -item[0])
    points, right = [], 0
    marks = {round(k * len(ordered) / CURVE_POINTS) for k in range(1, CURVE_POINTS + 1)} if ordered else set()
    for k, (p, verdict) in enumerate(ordered, start=1):
        right += verdict == CORRECT
        if k in marks:
            points.append({"p": round(p, 4), "coverage": k / questions, "accuracy": right / k,
                           "score": (2 * right - k) / questions})
    return points
