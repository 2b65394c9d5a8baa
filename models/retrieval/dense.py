"""Ranking over scores: cosine of unit-normalised vectors, top-k texts and the best tables within a budget."""

from __future__ import annotations

import numpy as np

from models.state import Reference


def best_first(scores: np.ndarray) -> list[int]:
    """Indices by descending score; ties keep the original order."""
    return [int(i) for i in np.argsort(-scores, kind="stable")]


def select(refs: list[Reference], scores: np.ndarray, k: int, table_budget_chars: int) -> list[int]:
    """Indices of the k best non-table references and of the best tables that fit the budget together, best
    first."""
    order = best_first(scores)
    texts = [i for i in order if refs[i].kind != "table"][:max(k, 0)]
    tables: list[int] = []
    used = 0
    for i in order:
        if refs[i].kind == "table" and used + len(refs[i].text) <= table_budget_chars:
            tables.append(i)
            used += len(refs[i].text)
    return sorted(texts + tables, key=lambda i: (-scores[i], i))
