"""Rule-based scoring: +1 correct, 0 "i don't know" (miss), -1 wrong (hallucination)."""

from __future__ import annotations

from dataclasses import dataclass

from utils.answers import is_idk, normalize_text, trim_to_tokens

CORRECT, MISS, WRONG = "correct", "miss", "wrong"


def judge_by_rules(prediction: str, answer: str, alt_answers: list[str]) -> str:
    """miss for an "i don't know" variant, correct for an exact match to any gold answer, else wrong."""
    prediction = trim_to_tokens(prediction)
    if is_idk(prediction):
        return MISS
    golds = {normalize_text(g) for g in [answer, *alt_answers]}
    return CORRECT if normalize_text(prediction) in golds else WRONG


@dataclass
class Scores:
    total: int
    correct: int
    miss: int
    wrong: int

    @classmethod
    def of(cls, verdicts: list[str]) -> Scores:
        return cls(len(verdicts), verdicts.count(CORRECT), verdicts.count(MISS), verdicts.count(WRONG))

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
    def score(self) -> float:
        return self.accuracy - self.hallucination

    def as_dict(self) -> dict[str, float | int]:
        return {"total": self.total, "score": self.score, "accuracy": self.accuracy,
                "hallucination": self.hallucination, "missing": self.missing}
