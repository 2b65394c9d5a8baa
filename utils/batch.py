"""The grader's batch: a dict of equal-length lists, one entry per query, with these fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BATCH_FIELDS = ("interaction_id", "query", "search_results", "query_time")
MAX_BATCH_SIZE = 16  # the most queries get_batch_size() may ask for


def batch_size_problem(size: Any) -> str | None:
    """Why `size` breaks the grader's contract for get_batch_size() (an int in 1..MAX_BATCH_SIZE), or None."""
    if isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= MAX_BATCH_SIZE:
        return None
    return f"get_batch_size() returned {size!r}; the grader accepts an int in 1..{MAX_BATCH_SIZE}"


def make_batch(examples: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The batch the grader would send for these CRAG examples (other keys, such as the answer, left out)."""
    return {key: [example[key] for example in examples] for key in BATCH_FIELDS}
