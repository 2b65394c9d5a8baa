"""Sub-query retrieval over one query's own evidence, for the multi-hop strategies.

The pool of a query is every candidate of its pages (chunks, tables, snippets, embedded once by the references
stage) and its KG results (embedded on first use and cached). Each search of a batch embeds all its sub-queries
(and the entities that re-rank them) in one call and returns the top-k of each query's own pool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from models.retrieval.dense import best_first
from models.state import QueryState, Reference


@dataclass(frozen=True)
class Request:
    state: QueryState
    text: str                 # the (sub-)question or keyword
    entity: str | None = None  # DualRAG: its score is added, so references about the entity come first


class LocalRetriever:
    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self._kg: dict[int, tuple[list[str], np.ndarray]] = {}  # id(state) -> (KG lines, their embeddings)

    def pool(self, state: QueryState) -> tuple[list[Reference], np.ndarray]:
        refs = list(state.candidates)
        vectors = state.candidate_vectors if state.candidate_vectors is not None and len(refs) else None
        if vectors is None:  # no candidates kept (references stage skipped): the selected references, if any
            refs, vectors = list(state.references), state.reference_vectors
        if state.kg_results:
            lines, kg_vectors = self._kg.get(id(state), (None, None))
            if lines != state.kg_results:
                lines, kg_vectors = list(state.kg_results), self.embedder.encode(state.kg_results)
                self._kg[id(state)] = (lines, kg_vectors)
            refs += [Reference(line, "kg") for line in lines]
            vectors = kg_vectors if vectors is None or not len(vectors) else np.vstack([vectors, kg_vectors])
        if vectors is None:
            return [], np.zeros((0, 1), dtype=np.float32)
        return refs, vectors

    def search(self, requests: list[Request], k: int) -> list[list[Reference]]:
        """The k best references of each request's own pool, best first, each with its score."""
        if not requests:
            return []
        entities = sorted({r.entity for r in requests if r.entity})
        vectors = self.embedder.encode([r.text for r in requests] + entities)
        by_entity = dict(zip(entities, vectors[len(requests):]))
        results = []
        for request, query in zip(requests, vectors):
            refs, pool = self.pool(request.state)
            if not refs:
                results.append([])
                continue
            scores = pool @ query
            if request.entity:
                scores = scores + pool @ by_entity[request.entity]
            results.append([replace(refs[i], score=float(scores[i])) for i in best_first(scores)[:max(k, 0)]])
        return results
