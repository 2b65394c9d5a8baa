"""Fitting the facts judge (evaluation/facts_judge.py) on person verdicts, and measuring it honestly.

Only the rows that neither the exact rules (`judge_by_rules`) nor the judge's decisive rules (`keyfact.decisive`)
decide reach the classifier, so only those are fit on. The measurement is nested K-fold cross-validation by
question: in each outer fold the regularisation C and the verdict threshold are chosen by an inner K-fold, repeated
over INNER_REPEATS seeds, on the outer training part alone (the pair with the best mean Cohen's kappa with the
person), the model is fit on that part, and it judges the outer test part; the outer predictions are pooled. K, the
seeds and the grids are fixed here. The shipped model is chosen and fit the same way on all the rows given. The rows
a caller gives are its development part: the lockbox (`held_back` questions of the labelled set) is judged once, by
`fit_file`, after the fit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evaluation.calibration import by_group, confusion, figures, sentence_share
from evaluation.facts_judge import FactsJudge, probabilities
from evaluation.judge import judge_by_rules
from evaluation.keyfact import FEATURES, best_features, decisive
from evaluation.verdicts import CORRECT, WRONG, Item
from utils.grader_tokens import grader_cut

FOLDS = 5
SEED = 0
INNER_REPEATS = 3  # the inner K-fold, repeated with other seeds: a choice less at the mercy of one split
C_GRID = (0.03, 0.1, 0.3, 1.0, 3.0)
THRESHOLDS = tuple(round(t, 2) for t in np.arange(0.3, 0.71, 0.05))


def item(row: dict[str, Any]) -> Item:
    return Item(str(row["query"]), str(row["answer"]), tuple(str(a) for a in row.get("alt_answers") or ()),
                str(row["prediction"]))


def ruled(row: dict[str, Any]) -> str | None:
    """The verdict of the exact rules or of the judge's decisive rules, None where the classifier decides."""
    said = judge_by_rules(item(row))
    if said is None and (certain := decisive(row["query"], [row["answer"], *(row.get("alt_answers") or ())],
                                             grader_cut(row["prediction"]))) is not None:
        said = certain[0]
    return said


def judge_decides(rows: Sequence[dict[str, Any]]) -> list[bool]:
    """Whether the facts judge, not the exact rules, gives each row's verdict: the verdicts a calibration counts."""
    return [judge_by_rules(item(r)) is None for r in rows]


def open_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows left to the classifier, whose person verdict is correct or wrong."""
    return [r for r in rows if r["human"] in (CORRECT, WRONG) and ruled(r) is None]


def design(rows: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features, person says correct, question) of each row."""
    matrix = [[f[name] for name in FEATURES] for f in (
        best_features(r["query"], [r["answer"], *(r.get("alt_answers") or ())], grader_cut(r["prediction"]))
        for r in rows)]
    return (np.array(matrix, dtype=float).reshape(len(rows), len(FEATURES)),
            np.array([r["human"] == CORRECT for r in rows]),
            np.array([" ".join(str(r["query"]).lower().split()) for r in rows]))


def _splits(y: np.ndarray, groups: np.ndarray, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import StratifiedGroupKFold

    folds = min(FOLDS, len(set(groups)))
    return list(StratifiedGroupKFold(folds, shuffle=True, random_state=seed).split(np.zeros(len(y)), y, groups))


def _fit(x: np.ndarray, y: np.ndarray, c: float) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression

    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0  # a feature constant here weighs nothing
    model = LogisticRegression(C=c, max_iter=5000).fit((x - mean) / scale, y)
    return {"features": list(FEATURES), "mean": mean.tolist(), "scale": scale.tolist(),
            "weights": model.coef_[0].tolist(), "bias": float(model.intercept_[0]), "C": c}


Predict = Callable[[np.ndarray], np.ndarray]  # features -> P(correct)


@dataclass(frozen=True)
class Learner:
    """A classifier of the open rows: `fit(x, y, setting)` gives P(correct) of new rows, for each setting of `grid`
    (simplest first: of settings equally good in the inner folds, the earlier is chosen). `setting` names the
    hyperparameter in the folds' figures."""
    name: str
    setting: str
    grid: tuple[Any, ...]
    fit: Callable[[np.ndarray, np.ndarray, Any], Predict]


def _logistic(x: np.ndarray, y: np.ndarray, c: float) -> Predict:
    model = _fit(x, y, c)
    return lambda new: probabilities(model, new)


LOGISTIC = Learner("logistic regression (shipped)", "C", C_GRID, _logistic)


def _kappa(y: np.ndarray, said: np.ndarray) -> float:
    from sklearn.metrics import cohen_kappa_score

    return float(cohen_kappa_score(y, said)) if len(set(y) | set(said)) > 1 else 0.0


def choose(x: np.ndarray, y: np.ndarray, groups: np.ndarray, seed: int = SEED,
           learner: Learner = LOGISTIC) -> tuple[Any, float]:
    """(setting, threshold) with the best Cohen's kappa of inner out-of-fold probabilities (ties: the earlier
    setting, then the threshold nearest 0.5)."""
    best: tuple[float, int, float, float] | None = None
    repeats = [_splits(y, groups, seed + 1 + repeat) for repeat in range(INNER_REPEATS)]
    for index, setting in enumerate(learner.grid):
        pooled = []
        for splits in repeats:
            oof = np.zeros(len(y))
            for train, test in splits:
                oof[test] = learner.fit(x[train], y[train], setting)(x[test])
            pooled.append(oof)
        for threshold in THRESHOLDS:
            kappa = np.mean([_kappa(y, oof >= threshold) for oof in pooled])
            rank = (round(float(kappa), 6), -index, -abs(threshold - 0.5), threshold)
            if best is None or rank > best:
                best = rank
    assert best is not None
    return learner.grid[-best[1]], best[3]


def fit(rows: Sequence[dict[str, Any]], seed: int = SEED) -> dict[str, Any]:
    """The shipped model: C and threshold chosen by K-fold on `rows`' open rows, then fit on all of them."""
    x, y, groups = design(open_rows(rows))
    c, threshold = choose(x, y, groups, seed)
    return {**_fit(x, y, c), "threshold": threshold}


Columns = Callable[[list[dict[str, Any]]], np.ndarray]  # rows -> more feature columns, one row each


def out_of_fold(rows: Sequence[dict[str, Any]], seed: int = SEED, learner: Learner = LOGISTIC,
                more: Columns | None = None) -> tuple[list[str], list[dict[str, Any]]]:
    """Each row's verdict with the rows of its question held out (nested: the learner's setting and the threshold
    chosen inside each outer fold), the exact rules' verdict where they decide; and each outer fold's choice and
    size. `more` adds feature columns to FEATURES' (an alternative measured against the shipped set)."""
    verdicts = [ruled(r) for r in rows]
    open_index = [i for i, r in enumerate(rows) if verdicts[i] is None and r["human"] in (CORRECT, WRONG)]
    chosen = [rows[i] for i in open_index]
    x, y, groups = design(chosen)
    if more is not None:
        x = np.hstack([x, more(chosen)])
    folds = []
    for train, test in _splits(y, groups, seed):
        setting, threshold = choose(x[train], y[train], groups[train], seed, learner)
        said = learner.fit(x[train], y[train], setting)(x[test]) >= threshold
        for position, correct in zip(test, said):
            verdicts[open_index[position]] = CORRECT if correct else WRONG
        folds.append({"train": len(train), "test": len(test), learner.setting: setting, "threshold": threshold,
                      "kappa_test": round(_kappa(y[test], said), 4)})
    return [v or WRONG for v in verdicts], folds


def data_hash(rows: Sequence[dict[str, Any]]) -> str:
    """SHA-256 of the rows' (query, gold answers, prediction, verdict), in order, as canonical JSON."""
    digest = hashlib.sha256()
    for r in rows:
        digest.update(json.dumps([r["query"], r["answer"], list(r.get("alt_answers") or ()), r["prediction"],
                                  r["human"]], ensure_ascii=False).encode("utf-8") + b"\n")
    return digest.hexdigest()


def _contains(rows: Sequence[dict[str, Any]]) -> list[str]:
    from evaluation.judge import judge_by_containment

    return [judge_by_containment(item(r))[0] for r in rows]


def _scored(rows: Sequence[dict[str, Any]], verdicts: Sequence[str]) -> dict[str, Any]:
    """`figures` overall and by group, of `verdicts` against the person's."""
    judged = [{**r, "verdict": v} for r, v in zip(rows, verdicts)]
    return {"all": figures(judged), **by_group(judged)}


def fit_file(development: dict[str, list[dict[str, Any]]], lockbox: list[dict[str, Any]] | None,
             seed: int = SEED) -> dict[str, Any]:
    """The judge file: the model fit on every set's development rows (`development`: set name -> rows), the
    nested cross-validation's figures on them beside `contains`', the lockbox's figures where `lockbox` is given
    (judged once by the fitted model), and the correction's counts from verdicts the model was not fit on (the
    outer folds' and the lockbox's). No text of a row is kept."""
    rows = [r for part in development.values() for r in part]
    model = fit(rows, seed)
    oof, folds = out_of_fold(rows, seed)
    by_set, start = {}, 0
    for name, part in development.items():
        ours = oof[start:start + len(part)]
        by_set[name] = {"facts": _scored(part, ours), "contains": _scored(part, _contains(part))}
        start += len(part)
    counts = confusion(rows, oof, judge_decides(rows))
    result: dict[str, Any] = {
        **model, "judge": "facts",
        "fit_on": {"sha256": data_hash(rows), "rows": len(rows), "open_rows": len(open_rows(rows)),
                   "sets": {name: len(part) for name, part in development.items()}},
        "protocol": {"folds": FOLDS, "seed": seed, "C_grid": list(C_GRID), "thresholds": list(THRESHOLDS),
                     "inner_repeats": INNER_REPEATS,
                     "split": "by question (StratifiedGroupKFold); C and threshold chosen inside each outer fold"},
        "folds": {"choices": folds, "by_set": by_set}}
    sources = ["out of fold"]
    if lockbox is not None:
        judge = FactsJudge(model)
        verdicts = [judged(judge, r) for r in lockbox]
        result["lockbox"] = {"sha256": data_hash(lockbox), "facts": _scored(lockbox, verdicts),
                             "contains": _scored(lockbox, _contains(lockbox))}
        for key, value in confusion(lockbox, verdicts, judge_decides(lockbox)).items():
            counts[key] += value
        rows = [*rows, *lockbox]
        sources.append("lockbox")
    result["calibration"] = {"counts": counts, "from": " and ".join(sources), "sentence_share": sentence_share(rows),
                             "models": sorted({str(r["model"]) for r in rows if r.get("model")})}
    return result


def unseen_verdicts(rows: Sequence[dict[str, Any]], development: dict[str, list[dict[str, Any]]],
                    model: dict[str, Any]) -> list[str]:
    """A verdict of the facts judge for each of `rows` that no judge fit on its question gave: out of fold where
    the row is one of `development`'s (all of it cross-validated together, as `fit_file` does), else the fitted
    `model`'s (a lockbox row, which it was not fit on)."""
    pooled = [r for part in development.values() for r in part]
    oof, _ = out_of_fold(pooled)
    by_row = {id(r): v for r, v in zip(pooled, oof)}
    judge = FactsJudge(model)
    return [by_row[id(r)] if id(r) in by_row else judged(judge, r) for r in rows]


def judged(judge: FactsJudge, row: dict[str, Any]) -> str:
    """The verdict `judge_records` gives a row with the facts judge: the exact rules', else the judge's."""
    return judge_by_rules(item(row)) or judge.verdict(item(row))[0]


def development_sets(real: Sequence[dict[str, Any]], name: str) -> dict[str, list[dict[str, Any]]]:
    """The rows the facts judge is developed and fit on: those of the labelled set of real answers (`real`, named
    `name`) and of data/judge's sets whose question is not held back."""
    from evaluation.calibration import SETS, held_back, load_set

    return {name: [r for r in real if not held_back(r["query"])],
            **{path.name: [r for r in load_set(path) if not held_back(r["query"])] for path in SETS}}
