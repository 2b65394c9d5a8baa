"""Whether the references a stage selects hold the gold answer: the recall the page and HASH-RAG benchmarks
report (an upper bound on what the LLM can answer from them)."""

from __future__ import annotations

import re
import statistics
from typing import Any

from evaluation.data import alternative_answers
from models.retrieval.embedder import Embedder
from models.stages.references import ReferencesStage
from models.stages.stage import run_alone
from models.state import QueryState
from utils.answers import contains_answer, normalize_text


def answer_found(example: dict[str, Any], texts: list[str]) -> bool:
    return contains_answer(" ".join(texts), [example["answer"], *alternative_answers(example)])


def token_recall(example: dict[str, Any], texts: list[str]) -> float:
    """The share of the gold answer's words (best over alternatives) found among the references' words.

    CRAG's real answers are often sentences that no page holds verbatim; this shows what recall cannot.
    """
    words = set(re.findall(r"\w+", normalize_text(" ".join(texts))))
    best = 0.0
    for answer in [example["answer"], *alternative_answers(example)]:
        needed = set(re.findall(r"\w+", normalize_text(str(answer))))
        if needed:
            best = max(best, len(needed & words) / len(needed))
    return best


def recall(examples: list[dict[str, Any]], processor: Any, config: Any,
           embedder: Embedder, hash_model: Any = None) -> tuple[int, int, float]:
    """(questions whose answer is in the selected references, questions counted, mean token recall);
    `hash_model` for a config with `references.retriever: hash`."""
    counted = [e for e in examples if normalize_text(e["answer"]) != "invalid question"]
    states = [QueryState(i, e["interaction_id"], e["query"], e["query_time"], e["search_results"])
              for i, e in enumerate(counted)]
    resources = {"embedder": embedder, "pages": processor, "hash_model": hash_model, "reranker": None, "llm": None}
    run_alone(ReferencesStage(), states, config, resources)
    selected = [[r.text for r in s.references] for s in states]
    found = sum(answer_found(e, texts) for e, texts in zip(counted, selected))
    tokens = statistics.fmean(token_recall(e, texts) for e, texts in zip(counted, selected)) if counted else 0.0
    return found, len(counted), tokens
