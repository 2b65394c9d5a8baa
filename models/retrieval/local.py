"""Sub-query retrieval over one query's own evidence, for the multi-hop strategies.

The pool of a query is every candidate of its pages (chunks, tables, snippets, embedded once by the references
stage; the references it chose are among them) and the lines of its evidence that is a source of its own (the KG's
rows: `Evidence.grounds`; embedded on first use and cached). Each search of a batch embeds all its sub-queries (and
the entities that re-rank them) in one call and returns the top-k of each query's own pool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from models.retrieval.dense import best_first
from models.state import EVIDENCE, QueryState, Reference

# The QueryState fields a search reads: a stage that searches declares them (`Stage.reads`, `may_read`).
POOL_READS = frozenset({"candidates", "candidate_vectors"})
POOL_MAY_READ = frozenset({EVIDENCE})


@dataclass(frozen=True)
class Request:
    state: QueryState
    text: str                 # the (sub-)question or keyword
    entity: str | None = None  # DualRAG: its score is added, so references about the entity come first


class LocalRetriever:
    """One per batch: the embeddings it computes itself are cached for the batch's life."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self._embedded: dict[tuple[int, str], tuple[list[str], np.ndarray]] = {}  # (id(state), part) -> texts, vectors

    def _vectors(self, state: QueryState, part: str, texts: list[str], given: np.ndarray | None) -> np.ndarray:
        """`given` when it matches the texts, else their embeddings (computed once, e.g. for states from a cache)."""
        if given is not None and len(given) == len(texts):
            return given
        cached = self._embedded.get((id(state), part))
        if cached is None or cached[0] != texts:
            cached = (texts, self.embedder.encode(texts))
            self._embedded[(id(state), part)] = cached
        return cached[1]

    def pool(self, state: QueryState) -> tuple[list[Reference], np.ndarray]:
        """The query's candidates and the lines of its evidence that is a source of its own, with their
        embeddings."""
        refs = list(state.candidates)
        texts = [r.embedded_as() for r in refs]
        parts = [self._vectors(state, "pages", texts, state.candidate_vectors)] if refs else []
        for block in state.grounding_blocks():
            refs += [Reference(str(line), block.kind) for line in block.lines]
            parts.append(self._vectors(state, block.name, [str(line) for line in block.lines], None))
        return refs, (np.vstack(parts) if parts else np.zeros((0, 1), dtype=np.float32))

    def search(self, requests: list[Request], k: int) -> list[list[Reference]]:
        """The k best references of each request's own pool, best first, each with its score."""
        if not requests:
            return []
        entities = sorted({r.entity for r in requests if r.entity})
        vectors = self.embedder.encode([r.text for r in requests] + entities)
        by_entity = dict(zip(entities, vectors[len(requests):]))
        results: list[list[Reference]] = []
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
