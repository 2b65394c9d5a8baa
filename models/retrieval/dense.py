"""Cosine top-k over unit-normalised vectors."""

from __future__ import annotations

import numpy as np


def top_k(query: np.ndarray, candidates: np.ndarray, k: int) -> list[tuple[int, float]]:
    """(index, cosine) of the k best candidates, best first; ties keep the original order."""
    if k <= 0 or len(candidates) == 0:
        return []
    scores = candidates @ query
    order = np.argsort(-scores, kind="stable")[:k]
    return [(int(i), float(scores[i])) for i in order]
