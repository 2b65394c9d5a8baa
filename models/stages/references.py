"""references: the batch's pages -> chunks, tables and snippets -> the best of them for each query.

All pages of the batch go to the page processor at once (worker processes, cached by content); the query and
every candidate are embedded in one call; chunks and snippets keep the cosine top-k, tables are kept best first
while they fit the table budget. With a re-ranker configured, a cross-encoder re-scores the best candidates first.

With `retriever: hash` (HASH-RAG), each candidate is split into propositions (embedded in the same call); a hash
index of the query's propositions ranks the candidates by their best proposition, and the propositions of the
kept references go to `state.propositions` for the PGCC prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from models.config import HashConfig, ReferencesConfig
from models.retrieval.dense import best_first, select
from models.retrieval.hash_index import HashIndex, HashModel, SearchSettings
from models.stages.base import StageContext
from models.state import Proposition, QueryState, Reference
from utils.answers import IDK
from utils.chunking import sentence_units
from utils.pages import PageSettings, ProcessedPage


def page_settings(config: ReferencesConfig) -> PageSettings:
    """The page-processing fields of the references config (PageSettings names them)."""
    return PageSettings(**{f.name: getattr(config, f.name) for f in fields(PageSettings)})


def _field(page: Mapping[str, Any], key: str) -> str:
    value = page.get(key)
    return " ".join(value.split()) if isinstance(value, str) else ""


def candidates(pages: list[Mapping[str, Any]], processed: list[ProcessedPage | None],
               use_snippets: bool) -> list[Reference]:
    """Every chunk, table and snippet of one query's pages, each text once, with its page's metadata."""
    refs: list[Reference] = []
    seen: set[str] = set()
    for page, result in zip(pages, processed):
        meta = (_field(page, "page_name"), _field(page, "page_url"), _field(page, "page_last_modified"))
        pieces = [(chunk, "chunk") for chunk in result.chunks] if result else []
        pieces += [(table, "table") for table in result.tables] if result else []
        snippet = _field(page, "page_snippet")
        if use_snippets and snippet:
            pieces.append((snippet, "snippet"))
        for text, kind in pieces:
            if text not in seen:
                seen.add(text)
                refs.append(Reference(text, kind, *meta))
    return refs


@dataclass
class Pool:
    """A query's ranked pool: candidate indices, their scores, and (hash retrieval) the best unit of each."""

    indices: list[int]
    scores: np.ndarray
    units: list[int] | None = None


def proposition_units(refs: list[Reference], config: HashConfig) -> tuple[list[str], list[int]]:
    """The propositions of a query's candidates and the candidate each came from; a table is one unit."""
    texts: list[str] = []
    sources: list[int] = []
    for i, ref in enumerate(refs):
        units = [ref.text] if ref.kind == "table" else sentence_units(ref.text, config.min_unit_chars,
                                                                     len(ref.text))
        texts += units
        sources += [i] * len(units)
    return texts, sources


def hash_pool(model: HashModel, config: HashConfig, query: np.ndarray, unit_vectors: np.ndarray,
              sources: list[int]) -> Pool:
    """The candidates that the query's propositions reach through a HASH-RAG index of them, best first."""
    index = HashIndex(model, config.engine)
    index.add(unit_vectors, sources, keep_vectors=config.exact)
    hits = index.search(query, len(set(sources)), SearchSettings(config.alpha, config.depth, config.exact))[0]
    return Pool([h.source for h in hits], np.array([h.score for h in hits], dtype=np.float32),
                [h.unit for h in hits])


class ReferencesStage:
    name = "references"
    prompt_names: tuple[str, ...] = ()

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        settings = ctx.config.references
        timeout = min(settings.timeout_s, ctx.work_deadline(self.name).remaining())
        flat = [(page.get("page_result"), _field(page, "page_name")) for s in states for page in s.pages]
        processed = ctx.pages.process(flat, timeout)
        per_query: list[list[Reference]] = []
        offset = 0
        for state in states:
            per_query.append(candidates(state.pages, processed[offset:offset + len(state.pages)], settings.use_snippets))
            offset += len(state.pages)
        hashing = settings.retriever == "hash"
        units = [proposition_units(refs, settings.hash) if hashing else ([], []) for refs in per_query]
        texts = ([state.query for state in states] + [ref.text for refs in per_query for ref in refs]
                 + [text for unit_texts, _ in units for text in unit_texts])
        vectors = ctx.embedder.encode(texts)  # one call: queries, candidates, propositions
        offset, unit_offset = len(states), len(states) + sum(len(refs) for refs in per_query)
        for state, refs, query, (unit_texts, sources) in zip(states, per_query, vectors, units):
            block = vectors[offset:offset + len(refs)]
            offset += len(refs)
            state.candidates, state.candidate_vectors = refs, block
            state.query_vector = query
            if hashing:
                unit_vectors = vectors[unit_offset:unit_offset + len(unit_texts)]
                unit_offset += len(unit_texts)
                pool = hash_pool(ctx.hash_model, settings.hash, query, unit_vectors, sources)
            else:
                pool = Pool(list(range(len(refs))), block @ query)
            if ctx.reranker is not None and pool.indices:
                keep = best_first(pool.scores)[:settings.rerank.candidates]
                indices = [pool.indices[i] for i in keep]
                pool = Pool(indices, ctx.reranker.score(state.query, [refs[i].text for i in indices]),
                            [pool.units[i] for i in keep] if pool.units else None)
            chosen = select([refs[i] for i in pool.indices], pool.scores, settings.top_k, settings.table_budget_chars)
            state.references = [replace(refs[pool.indices[c]], score=float(pool.scores[c])) for c in chosen]
            state.reference_vectors = block[[pool.indices[c] for c in chosen]]
            if pool.units is not None:
                state.propositions = [Proposition(pool.units[c], unit_texts[pool.units[c]], rank + 1,
                                                  refs[pool.indices[c]].page_name, float(pool.scores[c]))
                                      for rank, c in enumerate(chosen[:settings.hash.propositions])]
            if not state.references:
                state.finish(IDK, "no usable text in the search results")
