"""The words every judge speaks and every report reads: the verdicts, the judges' names in `judged_by`, and the
item a judge reads. A leaf module: the judges (evaluation/judge.py, evaluation/person_judge.py) and their readers
import it, not each other.

Verdicts: correct (+1), miss (0, "i don't know"), wrong (-1), unjudged (the LLM judge failed: reported on its own,
never counted as a hallucination).
"""

from __future__ import annotations

from dataclasses import dataclass

CORRECT, MISS, WRONG, UNJUDGED = "correct", "miss", "wrong", "unjudged"
VERDICTS = (CORRECT, MISS, WRONG, UNJUDGED)
CONTAINS = "contains"  # --judge contains (the default) and its verdicts' "judged_by": the containment rules
PERSON = "person:"  # --judge person:FILE


@dataclass(frozen=True)
class Item:
    query: str
    answer: str
    alt_answers: tuple[str, ...]
    prediction: str
