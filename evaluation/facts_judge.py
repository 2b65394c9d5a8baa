"""--judge facts (the default): the key-fact rules of evaluation/keyfact.py, with no model server. Where the gold's
form leaves the reading certain, a decisive rule gives the verdict (`keyfact.decisive`); elsewhere a small
answer-equivalence classifier fit on person verdicts weighs the rules' features.

The classifier is a logistic regression over the rules' features, its weights in a readable JSON file
(data/judge/facts.json) written by `tools/fit_judge.py` (evaluation/judge_fit.py), beside the hash of the data it
was fit on, its folds' figures and the confusion counts that correct a run's score for its errors
(evaluation/correction.py). The file holds no text of the data.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.keyfact import FEATURES, best_features, decisive
from evaluation.verdicts import CORRECT, FACTS, WRONG, Item, Judge
from models.config import REPO_ROOT, ConfigError
from utils.grader_tokens import grader_cut

MODEL_FILE = REPO_ROOT / "data" / "judge" / "facts.json"


class Classifier:
    """A fitted logistic regression over FEATURES, standardised: P(correct) = sigmoid(w . (x - mean) / scale + b),
    correct at or above `threshold`."""

    def __init__(self, model: dict[str, Any]) -> None:
        if list(model.get("features") or ()) != list(FEATURES):
            raise ConfigError(f"{model.get('path', 'the judge file')}: its features are not this judge's "
                              "(evaluation/keyfact.py FEATURES); refit it: make judge")
        self.model = model
        self.mean, self.scale = model["mean"], model["scale"]
        self.weights = model["weights"]
        self.threshold = float(model["threshold"])

    def p_correct(self, values: dict[str, float]) -> float:
        return float(probabilities(self.model, np.array([[values[name] for name in FEATURES]]))[0])

    def reason(self, values: dict[str, float]) -> str:
        """The three features that moved P(correct) most from the average answer's."""
        pulls = sorted(((w * (values[name] - m) / s, name)
                        for name, w, m, s in zip(FEATURES, self.weights, self.mean, self.scale)),
                       key=lambda pull: -abs(pull[0]))
        return ", ".join(f"{name} {'+' if pull > 0 else '-'}" for pull, name in pulls[:3])


def probabilities(model: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """P(correct) of each row of features `x` (columns in FEATURES' order) under a fitted `model`."""
    z = ((x - np.array(model["mean"])) / np.array(model["scale"])) @ np.array(model["weights"]) + model["bias"]
    return 1 / (1 + np.exp(-z))


def load_model(path: Path = MODEL_FILE) -> dict[str, Any]:
    """The judge file; a ConfigError naming it and `make judge` where it is missing or unreadable."""
    try:
        model = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a fitted facts judge ({err}); fit it with make judge") from None
    if not isinstance(model, dict):
        raise ConfigError(f"{path}: not a fitted facts judge; fit it with make judge")
    return {**model, "path": str(path)}


class FactsJudge(Judge):
    """The key-fact rules and the fitted classifier: no model, no cache, the same verdict every time. Like
    `contains`, it never stands in for the organisers' LLM judge."""

    kind = name = FACTS
    for_organisers = False

    def __init__(self, model: dict[str, Any] | None = None) -> None:
        self.model = model if model is not None else load_model()
        self.classifier = Classifier(self.model)
        self.reasons: dict[str, str] = {}
        self.p_correct: dict[str, float] = {}

    @classmethod
    def from_spec(cls, spec: str, model_name: str | None) -> FactsJudge:
        return cls()

    def key(self, item: Item) -> str:
        return item.key()

    def verdict(self, item: Item) -> tuple[str, float, str]:
        """(verdict, P(correct), reason) of one item: a decisive rule's (P 1 or 0), else the classifier's."""
        golds, prediction = [item.answer, *item.alt_answers], grader_cut(item.prediction)
        if (ruled := decisive(item.query, golds, prediction)) is not None:
            return ruled[0], float(ruled[0] == CORRECT), ruled[1]
        values = best_features(item.query, golds, prediction)
        p = self.classifier.p_correct(values)
        return (CORRECT if p >= self.classifier.threshold else WRONG), p, self.classifier.reason(values)

    def judge(self, items: Sequence[Item]) -> list[str]:
        verdicts = []
        for item in items:
            verdict, p, why = self.verdict(item)
            key = self.key(item)
            self.reasons[key], self.p_correct[key] = f"facts: P(correct) {p:.2f} ({why})", p
            verdicts.append(verdict)
        return verdicts
