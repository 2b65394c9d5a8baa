"""The grader's batch: a dict of equal-length lists, one entry per query, with these fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

BATCH_FIELDS = ("interaction_id", "query", "search_results", "query_time")
MAX_BATCH_SIZE = 16  # the most queries get_batch_size() may ask for


def id_text(value: Any) -> str | None:
    """An interaction_id as text: a string as it is, an integer as its digits (not a bool), else None."""
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else None


def batch_size_problem(size: Any) -> str | None:
    """Why `size` breaks the grader's contract for get_batch_size() (an int in 1..MAX_BATCH_SIZE), or None."""
    if isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_BATCH_SIZE:
        return None
    return f"get_batch_size() returned {size!r}; the grader accepts an int in 1..{MAX_BATCH_SIZE}"


def make_batch(examples: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The batch the grader would send for these CRAG examples (other keys, such as the answer, left out)."""
    return {key: [example[key] for example in examples] for key in BATCH_FIELDS}


@dataclass(frozen=True)
class BatchResult:
    """What a model gives the harness (the runner, the model worker, Ray) for one batch: the answers, as the grader
    reads them from batch_generate_answer, and one trace record per query (QueryState.record(); none for a model
    that keeps no trace)."""

    answers: list[str]
    trace: list[dict[str, Any]] = field(default_factory=list)


@runtime_checkable
class TracedModel(Protocol):
    """A model whose batches come with their trace (models.system.CragSystem, the grader's UserModel)."""

    def answer_batch(self, batch: dict[str, list[Any]]) -> BatchResult: ...


def answer_batch(model: Any, batch: dict[str, list[Any]]) -> BatchResult:
    """The model's result for `batch`: its own answer_batch where its batch_generate_answer answers through it, else
    its batch_generate_answer with no trace, as the grader calls it (any model the grader could call, and a subclass
    of UserModel that overrides batch_generate_answer: override answer_batch instead to keep the trace)."""
    if isinstance(model, TracedModel) and _answers_through_answer_batch(type(model)):
        return model.answer_batch(batch)
    return BatchResult(model.batch_generate_answer(batch))


def _answers_through_answer_batch(cls: type) -> bool:
    """Whether `cls`'s batch_generate_answer is defined no lower in its hierarchy than its answer_batch, so it is
    the one written to return answer_batch's answers (models.system.CragSystem's)."""
    def owner(name: str) -> type:
        return next(klass for klass in cls.__mro__ if name in vars(klass))

    return cls.__mro__.index(owner("batch_generate_answer")) >= cls.__mro__.index(owner("answer_batch"))
