"""Fitting the answer gate (models/gate/answer_gate.py) on judged records: P(correct | signals) by logistic
regression on standardised signals with missing-value columns, its regularisation chosen by cross-validation grouped
by question, and the threshold that maximises the CRAG score of the out-of-fold probabilities.

An answer pays only when it is more likely right than wrong (+1, 0, -1), so the threshold is chosen by the score
itself, not by accuracy or log-loss (docs/decisions/answer-gate-threshold.md).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold, cross_val_predict, cross_val_score

from evaluation.judge import judge_by_rules
from evaluation.metrics import paired_difference
from evaluation.record import records_of
from evaluation.verdicts import CONTAINS, CORRECT, FACTS, MISS, WRONG, Item
from models.gate.answer_gate import Gate, columns_for, raw_row
from utils.errors import HarnessError

MIN_LABELS = 20  # under this, a threshold chosen by cross-validation is noise
MAX_FOLDS = 5
C_GRID = tuple(float(c) for c in np.logspace(-3, 2, 11))


class TooFewLabels(HarnessError, ValueError):
    """The records cannot fit a gate (too few labels, one class); the message says what there is."""


@dataclass
class Labelled:
    """Records a gate can learn from: signals, 1 for correct and 0 for wrong, the question each is of; `counts`
    says how many records were used and why the others were left out."""

    signals: list[dict[str, Any]] = field(default_factory=list)
    correct: list[int] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


# Judges whose "wrong" is a reading of the answer, not only the absence of an exact match.
LABELLERS = {"llm": "the LLM judge", "person": "a person", FACTS: "the facts judge", CONTAINS: "the containment judge"}


def label_records(lines: list[dict[str, Any]], rules_wrong_is_wrong: bool = False) -> Labelled:
    """The labelled records among judged ones. Labels come from an LLM judge, a person (`--judge person:FILE`), the
    facts judge (`--judge facts`, the default) or the containment judge (`--judge contains`), which read a sentence
    for the gold answer, or
    from what our rules decide (an exact or alternative match, the "invalid question" rules); an answer marked
    wrong only because it matched no gold answer exactly (`--judge rules`, or the rules' fallback when the LLM
    judge failed) is left out unless `rules_wrong_is_wrong` (data with short gold answers, where no match is a
    wrong answer)."""
    out = Labelled()
    # a gated run's withheld answers teach as much as the others
    for record in (r.without_gate() for r in records_of(lines)):
        verdict, by = record.verdict, record.judged_by
        if verdict == MISS:
            out.counts["i don't know (nothing to gate)"] += 1
            continue
        if verdict not in (CORRECT, WRONG):
            out.counts["unjudged"] += 1
            continue
        signals = record.signals
        if signals is None:
            out.counts["no signals (run before signals were recorded)"] += 1
            continue
        if by in LABELLERS:
            out.counts[f"labelled by {LABELLERS[by]}"] += 1
        elif verdict == CORRECT:
            out.counts["labelled correct by the rules"] += 1
        elif by == "rules" and judge_by_rules(Item(str(record.query or ""), str(record.answer or ""),
                                                   tuple(str(a) for a in record.alt_answers or []),
                                                   str(record.prediction or ""))) == WRONG:
            out.counts["labelled wrong by the rules"] += 1
        elif rules_wrong_is_wrong:
            out.counts["no exact match, taken as wrong (--rules-wrong-is-wrong)"] += 1
        else:
            out.counts["no exact match, left out (--rules-wrong-is-wrong takes it as wrong)"] += 1
            continue
        out.signals.append(signals)
        out.correct.append(int(verdict == CORRECT))
        out.questions.append(str(record.interaction_id))
    return out


def design(columns, examples: list[dict[str, Any]]) -> tuple[np.ndarray, list[float], list[float]]:
    """The standardised matrix of `examples` over `columns`, and each column's mean and scale (1 where constant)."""
    raw = np.array([[np.nan if v is None else v for v in raw_row(columns, s)] for s in examples],
                   dtype=float).reshape(len(examples), len(columns))
    present = ~np.isnan(raw)
    mean = np.where(present, raw, 0.0).sum(axis=0) / np.maximum(present.sum(axis=0), 1)
    filled = np.where(present, raw, mean)
    scale = filled.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    return (filled - mean) / scale, [float(m) for m in mean], [float(s) for s in scale]


def crag_score(p: np.ndarray, correct: np.ndarray, threshold: float) -> float:
    """The mean CRAG points of answering where p >= threshold (+1 right, -1 wrong) and abstaining elsewhere (0)."""
    answered = p >= threshold
    return float(np.where(answered, 2 * correct - 1, 0).mean()) if len(p) else 0.0


def best_threshold(p: np.ndarray, correct: np.ndarray) -> float:
    """The threshold with the best crag_score on (p, correct): midpoints between the sorted distinct p, and the two
    ends (answer everything, nothing); ties go to the one that answers more."""
    values = np.unique(p)
    candidates = [0.0, *((values[1:] + values[:-1]) / 2), float(values[-1]) + 1e-9 if len(values) else 1.0]
    scores = [crag_score(p, correct, t) for t in candidates]
    best = max(scores)
    return float(next(t for t, s in zip(candidates, scores) if s >= best - 1e-12))


def verdicts(correct: np.ndarray, answered: np.ndarray) -> list[str]:
    return [(CORRECT if c else WRONG) if a else MISS for c, a in zip(correct, answered)]


@dataclass
class CrossValidated:
    """A gate's cross-validation on labelled records: the design, the chosen C, each record's out-of-fold
    P(correct) and the threshold that maximises the score over them."""

    columns: list
    x: np.ndarray
    mean: list[float]
    scale: list[float]
    y: np.ndarray
    folds: int
    c: float
    oof: np.ndarray
    threshold: float

    @property
    def answered(self) -> np.ndarray:
        return self.oof >= self.threshold


def cross_validate(labelled: Labelled, seed: int = 0) -> CrossValidated:
    """The cross-validation `fit_gate` reports (TooFewLabels where it cannot be done): folds grouped by question."""
    y = np.array(labelled.correct, dtype=int)
    classes = Counter(labelled.correct)
    questions = len(set(labelled.questions))
    folds = min(MAX_FOLDS, min(classes.values(), default=0), questions)
    if len(y) < MIN_LABELS or len(classes) < 2 or folds < 2:
        raise TooFewLabels(f"{len(y)} labelled answers ({classes.get(1, 0)} correct, {classes.get(0, 0)} wrong) of "
                           f"{questions} questions: a gate needs at least {MIN_LABELS}, with two of each kind")
    columns = columns_for(labelled.signals)
    x, mean, scale = design(columns, labelled.signals)
    groups = np.array(labelled.questions)
    splits = list(StratifiedGroupKFold(folds, shuffle=True, random_state=seed).split(x, y, groups))
    losses = {c: -cross_val_score(LogisticRegression(C=c, max_iter=2000), x, y, cv=splits,
                                  scoring="neg_log_loss").mean() for c in C_GRID}
    c = min(losses, key=lambda key: losses[key])  # the first of equals: the strongest regularisation
    oof = cross_val_predict(LogisticRegression(C=c, max_iter=2000), x, y, cv=splits, method="predict_proba")[:, 1]
    return CrossValidated(columns, x, mean, scale, y, folds, c, oof, best_threshold(oof, y))


def fit_gate(labelled: Labelled, seed: int = 0) -> Gate:
    """The gate fit on `labelled` (TooFewLabels where it cannot be), with its cross-validated figures."""
    cv = cross_validate(labelled, seed)
    y, answered = cv.y, cv.answered
    model = LogisticRegression(C=cv.c, max_iter=2000).fit(cv.x, y)
    ungated, gated = verdicts(y, np.ones(len(y), bool)), verdicts(y, answered)
    abstaining = [MISS] * len(y)
    figures = {
        "records": len(y), "questions": len(set(labelled.questions)), "correct": int(y.sum()),
        "wrong": int(len(y) - y.sum()), "folds": cv.folds, "C": cv.c, "threshold": cv.threshold,
        "coverage": float(answered.mean()), "accuracy_answered": float(y[answered].mean()) if answered.any() else None,
        "cv_score": {"no gate": crag_score(cv.oof, y, 0.0), "gate": crag_score(cv.oof, y, cv.threshold),
                     "always i don't know": 0.0, "oracle": float(y.mean())},
        "gate_minus_no_gate": paired_difference(ungated, gated, seed),
        "gate_minus_always_idk": paired_difference(abstaining, gated, seed),
        "counts": dict(labelled.counts),
    }
    weights = [float(w) for w in model.coef_[0]]
    figures["weights"] = {
        f"{c.signal}{'=' + c.value if c.value else ''}{' (missing)' if c.kind == 'missing' else ''}": w
        for c, w in zip(cv.columns, weights)
    }
    return Gate(cv.columns, cv.mean, cv.scale, weights, float(model.intercept_[0]), cv.threshold, figures=figures)
