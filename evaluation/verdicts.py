"""The words every judge speaks and every report reads: the verdicts, the judges' names in `judged_by`, the item
a judge reads, and the base class of the judges. A leaf module: the judges (evaluation/judge.py,
evaluation/person_judge.py) and their readers import it, not each other.

Verdicts: correct (+1), miss (0, "i don't know"), wrong (-1), unjudged (the LLM judge failed: reported on its own,
never counted as a hallucination).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from utils.cache import content_key
from utils.grader_tokens import grader_cut

CORRECT, MISS, WRONG, UNJUDGED = "correct", "miss", "wrong", "unjudged"
VERDICTS = (CORRECT, MISS, WRONG, UNJUDGED)
CONTAINS = "contains"  # --judge contains and its verdicts' "judged_by": the containment rules
FACTS = "facts"  # --judge facts (the default) and its verdicts' "judged_by": the key-fact rules and classifier
PERSON = "person:"  # --judge person:FILE


@dataclass(frozen=True)
class Item:
    query: str
    answer: str
    alt_answers: tuple[str, ...]
    prediction: str

    def key(self, *judge: str) -> str:
        """The item's key in a judge's `reasons` and `p_correct`: the question, its golds and the prediction as the
        grader cuts it, and what names the judge where its verdicts differ by model or prompt (`judge`)."""
        return content_key(self.query, self.answer, *self.alt_answers, "\x00", grader_cut(self.prediction), *judge)


class Judge(ABC):
    """What judges the predictions the rules leave open (evaluation/judge.py's JUDGES registers each kind)."""

    kind: str  # what the records' judged_by says: llm, person, contains
    name: str  # the judge's model or file, as reports name it
    for_organisers: bool  # whether it also judges for the organisers' rules (their LLM judge would be asked)
    reasons: dict[str, str]  # each verdict's reason, by key
    p_correct: dict[str, float]  # P(correct) of each verdict, by key, where the backend gives log-probabilities

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: str, model_name: str | None) -> Judge:
        """The judge `--judge spec` (and `--judge-model`) names, ready to judge; ConfigError where it cannot be."""

    @abstractmethod
    def key(self, item: Item) -> str:
        """The item's key in `reasons` and `p_correct`."""

    @abstractmethod
    def judge(self, items: Sequence[Item]) -> list[str]:
        """A verdict per item, in order."""

    def kind_of(self, key: str) -> str:
        """What judged_by says of the verdict under `key` (a chain of judges: the one that gave it)."""
        return self.kind
