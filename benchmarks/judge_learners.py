"""The facts judge's classifier against the alternatives the judge issue names, on the development half only.

Every alternative decides the same rows as the shipped logistic regression (those the exact and the decisive rules
leave open), under the same protocol (evaluation/judge_fit.py): nested K-fold by question, its setting and the
verdict threshold chosen in the inner folds, the outer predictions pooled with the rules' verdicts. The lockbox
(the labelled set's held-back questions) is not read. Rows:

- the shipped logistic regression over the key-fact features;
- rules alone: the key fact matched by hand-written conditions (containment, all of the key fact, a number or date
  by value, the gold's option named first), vetoed by a guard, a conflicting number, a bound or a no-answer cue,
  else the share of the key fact's words the prediction gives; only the threshold is chosen in the folds;
- gradient-boosted trees and a random forest over the same features;
- the logistic regression with one more feature: the packaged MiniLM's cosine of the prediction and the closest
  gold (its cost per answer printed: the judge's budget is a p95 of 20 ms an answer, load excluded).

Printed on the labelled set's development half (its answers not held back), beside containment:

    python -m benchmarks.judge_learners
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from evaluation.calibration import REAL_SET, figures, load_set
from evaluation.judge import judge_by_containment
from evaluation.judge_fit import LOGISTIC, Learner, Predict, development_sets, item, out_of_fold
from evaluation.keyfact import FEATURES
from utils.cli import command

SEED = 0
EMBED_TIMED = 100  # answers embedded one at a time for the MiniLM feature's cost


def _column(name: str) -> int:
    return FEATURES.index(name)


_MATCH = [_column(n) for n in ("contains", "key_all", "num_match", "date_match", "cmp_gold_first")]
_VETO = [_column(n) for n in ("contains_guard", "num_conflict", "num_bound", "no_answer_cue")]
_RECALL = _column("key_recall")


def _rules(x: np.ndarray, y: np.ndarray, setting: None) -> Predict:
    def predict(new: np.ndarray) -> np.ndarray:
        matched = np.where(new[:, _MATCH].max(axis=1) > 0, 1.0, new[:, _RECALL])
        return np.where(new[:, _VETO].max(axis=1) > 0, 0.0, matched)

    return predict


def _boosted(x: np.ndarray, y: np.ndarray, depth: int) -> Predict:
    from sklearn.ensemble import HistGradientBoostingClassifier

    model = HistGradientBoostingClassifier(max_depth=depth, max_iter=100, random_state=SEED).fit(x, y)
    return lambda new: model.predict_proba(new)[:, 1]


def _forest(x: np.ndarray, y: np.ndarray, leaf: int) -> Predict:
    from sklearn.ensemble import RandomForestClassifier

    model = RandomForestClassifier(n_estimators=200, min_samples_leaf=leaf, random_state=SEED, n_jobs=1).fit(x, y)
    return lambda new: model.predict_proba(new)[:, 1]


LEARNERS = (LOGISTIC,
            Learner("rules alone", "setting", (None,), _rules),
            Learner("gradient-boosted trees", "max_depth", (2, 3), _boosted),
            Learner("random forest", "min_samples_leaf", (10, 5, 2), _forest))


class Similarity:
    """The packaged MiniLM's cosine of each row's prediction and its closest gold answer or alternative."""

    def __init__(self) -> None:
        from models.config.sections import EmbedderConfig
        from models.retrieval.embedder import Embedder

        self.embedder = Embedder(EmbedderConfig())

    def __call__(self, rows: list[dict[str, Any]]) -> np.ndarray:
        texts = sorted({t for r in rows for t in (str(r["prediction"]), *self._golds(r))})
        vectors = dict(zip(texts, self.embedder.encode(texts)))
        return np.array([[max(float(vectors[str(r["prediction"])] @ vectors[g]) for g in self._golds(r))]
                         for r in rows])

    def cost(self, rows: list[dict[str, Any]]) -> np.ndarray:
        """Seconds to embed one answer's prediction and golds, one call each, as a judge reading one answer would."""
        spent = []
        for r in rows[:EMBED_TIMED]:
            started = time.perf_counter()
            for text in (str(r["prediction"]), *self._golds(r)):
                self.embedder.encode([text])
            spent.append(time.perf_counter() - started)
        return np.array(spent)

    @staticmethod
    def _golds(row: dict[str, Any]) -> list[str]:
        return [str(g) for g in (row["answer"], *(row.get("alt_answers") or ())) if str(g).strip()]


def _line(name: str, result: dict[str, Any]) -> str:
    return (f"| {name} | {result['n']} | {result['agreement']:.1%} | {result['recall_correct']:.1%} | "
            f"{result['recall_incorrect']:.1%} | {result['kappa']:.3f} |")


@command
def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    if not REAL_SET.is_file():
        print(f"judge_learners: {REAL_SET} is not there; it measures on the labelled set of real answers",
              file=sys.stderr)
        return 1
    development = development_sets(load_set(REAL_SET), REAL_SET.name)
    rows = [r for part in development.values() for r in part]
    real = len(development[REAL_SET.name])  # the labelled set's rows come first
    mine = rows[:real]
    print(f"the labelled set's development half: {real} answers (the lockbox not read), fit with data/judge's "
          f"development halves ({len(rows) - real} more)")
    print("| classifier | n | agreement | recall correct | recall incorrect | kappa |")
    print("|---|---|---|---|---|---|")
    print(_line("contains", figures([{**r, "verdict": judge_by_containment(item(r))[0]} for r in mine])))
    similarity = Similarity()
    for learner, more in [*((each, None) for each in LEARNERS), (LOGISTIC, similarity)]:
        started = time.perf_counter()
        verdicts, folds = out_of_fold(rows, SEED, learner, more)
        name = learner.name if more is None else f"{learner.name} + MiniLM cosine"
        chosen = ", ".join(f"{f[learner.setting]} at {f['threshold']}" for f in folds)
        spent = time.perf_counter() - started
        print(_line(f"{name} ({learner.setting} and threshold by fold: {chosen}; {spent:.0f} s)",
                    figures([{**r, "verdict": v} for r, v in zip(mine, verdicts[:real])])))
    spent = similarity.cost(mine)
    print(f"MiniLM feature's cost: p50 {np.percentile(spent, 50) * 1e3:.1f} ms, p95 "
          f"{np.percentile(spent, 95) * 1e3:.1f} ms an answer over {len(spent)} answers (prediction and golds, one "
          "call each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
