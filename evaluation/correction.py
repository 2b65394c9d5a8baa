"""A score corrected for the judge's measured errors (the Rogan-Gladen estimator), with a bootstrap interval that
counts both the run's questions and the calibration set's size.

A judge that decides a share of a run's answers errs at known rates: on a calibration set of person verdicts it
called `sensitivity` of the person's "correct" answers correct and `specificity` of the person's "incorrect" ones
wrong. Of the m answers it decided, a share q it called correct; the share that is correct by the person is then
(q + specificity - 1) / (sensitivity + specificity - 1), clipped to [0, 1]. Only the judge's own verdicts are
corrected: the exact rules' verdicts and the misses count as they are.

Rogan-Gladen rather than prediction-powered inference: PPI's rectifier is the judge's mean error on the
calibration set, which moves with that set's share of right answers; the error rates given the person's verdict
move less between a weak model's run and a strong one's (docs/concepts/judging.md).

The interval resamples the run's questions and, independently, the calibration set's verdicts (each rate
binomially from its own count), so a small calibration set widens it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from evaluation.metrics import MIN_FOR_INTERVAL, RESAMPLES
from evaluation.verdicts import CORRECT, WRONG

MIN_YOUDEN = 0.05  # sensitivity + specificity - 1 at least this: a judge no better than chance corrects nothing


@dataclass(frozen=True)
class Calibration:
    """What a judge's errors were measured on: its name, the counts of (person, judge) verdicts on the answers the
    judge decided, and what the set's answers were like (for the warning when a run's differ)."""

    name: str
    counts: dict[str, int]
    sentence_share: float | None = None
    models: tuple[str, ...] = field(default_factory=tuple)

    @property
    def correct(self) -> int:
        return self.counts["correct_correct"] + self.counts["correct_wrong"]

    @property
    def wrong(self) -> int:
        return self.counts["wrong_correct"] + self.counts["wrong_wrong"]

    @property
    def sensitivity(self) -> float:
        return self.counts["correct_correct"] / self.correct if self.correct else float("nan")

    @property
    def specificity(self) -> float:
        return self.counts["wrong_wrong"] / self.wrong if self.wrong else float("nan")

    def usable(self) -> str | None:
        """Why this calibration cannot correct a score, or None where it can."""
        if not self.correct or not self.wrong:
            return (f"{self.name}: the judge decided no answer the person called "
                    f"{'correct' if not self.correct else 'incorrect'}, so its error rates are unknown")
        if self.sensitivity + self.specificity - 1 < MIN_YOUDEN:
            return f"{self.name}: the judge's verdicts there are no better than chance"
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "counts": self.counts, "sensitivity": self.sensitivity,
                "specificity": self.specificity, "sentence_share": self.sentence_share, "models": list(self.models)}

    @classmethod
    def of(cls, data: dict[str, Any], name: str) -> Calibration:
        return cls(name, {k: int(data["counts"][k]) for k in ("correct_correct", "correct_wrong", "wrong_correct",
                                                              "wrong_wrong")},
                   data.get("sentence_share"), tuple(data.get("models") or ()))


def _rogan_gladen(observed: np.ndarray, sensitivity: np.ndarray, specificity: np.ndarray) -> np.ndarray:
    youden = np.maximum(sensitivity + specificity - 1, MIN_YOUDEN)
    return np.clip((observed + specificity - 1) / youden, 0.0, 1.0)


Estimator = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _estimator(verdicts: Sequence[str], judged: Sequence[bool]) -> Estimator:
    """The corrected (accuracy, hallucination) of the questions in each row of an index array, given each row's
    sensitivity and specificity."""
    n = len(verdicts)
    right = np.array([v == CORRECT for v in verdicts])
    own = np.array(judged, dtype=bool) & np.array([v in (CORRECT, WRONG) for v in verdicts])
    said_correct = right & own
    exact_correct = right & ~np.array(judged, dtype=bool)
    exact_wrong = np.array([v == WRONG for v in verdicts]) & ~np.array(judged, dtype=bool)

    def estimate(take: np.ndarray, sensitivity: np.ndarray, specificity: np.ndarray) -> np.ndarray:
        m = own[take].sum(axis=-1)
        observed = np.where(m > 0, said_correct[take].sum(axis=-1) / np.maximum(m, 1), 0.0)
        truly = _rogan_gladen(observed, sensitivity, specificity) * m
        return np.stack([(exact_correct[take].sum(axis=-1) + truly) / n,
                         (exact_wrong[take].sum(axis=-1) + m - truly) / n])

    return estimate


def _draws(calibration: Calibration, n: int, seed: int, resamples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(question indices, sensitivities, specificities) of each bootstrap resample: the run's questions with
    replacement, each rate binomially from its own count of the calibration set."""
    rng = np.random.default_rng(seed)
    take = rng.integers(0, n, size=(resamples, n))
    sensitivity = rng.binomial(calibration.correct, calibration.sensitivity, resamples) / calibration.correct
    specificity = rng.binomial(calibration.wrong, calibration.specificity, resamples) / calibration.wrong
    return take, sensitivity, specificity


def _point(estimate: Estimator, n: int, calibration: Calibration) -> np.ndarray:
    return estimate(np.arange(n)[None, :], np.array([calibration.sensitivity]),
                    np.array([calibration.specificity]))[:, 0]


def _bounds(values: np.ndarray) -> list[float]:
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def corrected(verdicts: Sequence[str], judged: Sequence[bool], calibration: Calibration, seed: int = 0,
              resamples: int = RESAMPLES) -> dict[str, Any]:
    """The corrected score, accuracy and hallucination rate of a run whose answers have `verdicts`, `judged` where
    the calibrated judge gave the verdict, with percentile 95% intervals (None under MIN_FOR_INTERVAL questions).
    A ValueError where the calibration cannot correct (`Calibration.usable`)."""
    if (why := calibration.usable()) is not None:
        raise ValueError(why)
    n = len(verdicts)
    estimate = _estimator(verdicts, judged)
    accuracy, hallucination = _point(estimate, n, calibration)
    result: dict[str, Any] = {"score": float(accuracy - hallucination), "accuracy": float(accuracy),
                              "hallucination": float(hallucination), "total": n, "ci95": None,
                              "judged": int(sum(bool(j) and v in (CORRECT, WRONG) for v, j in zip(verdicts, judged))),
                              "calibration": calibration.as_dict()}
    if n >= MIN_FOR_INTERVAL:
        drawn_accuracy, drawn_hallucination = estimate(*_draws(calibration, n, seed, resamples))
        result["ci95"] = {"score": _bounds(drawn_accuracy - drawn_hallucination), "accuracy": _bounds(drawn_accuracy),
                          "hallucination": _bounds(drawn_hallucination)}
    return result


def corrected_difference(a: tuple[Sequence[str], Sequence[bool]], b: tuple[Sequence[str], Sequence[bool]],
                         calibration: Calibration, seed: int = 0, resamples: int = RESAMPLES) -> dict[str, Any]:
    """Run B's corrected score minus run A's over the same questions (`a` and `b`: verdicts and judged flags, in the
    same order), with a paired interval: each resample takes the same questions and the same error rates for both,
    since one judge erred on both runs."""
    if (why := calibration.usable()) is not None:
        raise ValueError(why)
    n = len(a[0])
    first, second = _estimator(*a), _estimator(*b)
    score_a, score_b = (float(np.subtract(*_point(e, n, calibration))) for e in (first, second))
    result: dict[str, Any] = {"score_a": score_a, "score_b": score_b, "difference": score_b - score_a, "ci95": None,
                              "calibration": calibration.name}
    if n >= MIN_FOR_INTERVAL:
        draws = _draws(calibration, n, seed, resamples)
        drawn_a, drawn_b = first(*draws), second(*draws)
        result["ci95"] = _bounds((drawn_b[0] - drawn_b[1]) - (drawn_a[0] - drawn_a[1]))
    return result
