"""The grader's batch: a dict of equal-length lists, one entry per query, with these fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BATCH_FIELDS = ("interaction_id", "query", "search_results", "query_time")


def make_batch(examples: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The batch the grader would send for these CRAG examples (other keys, such as the answer, left out)."""
    return {key: [example[key] for example in examples] for key in BATCH_FIELDS}
