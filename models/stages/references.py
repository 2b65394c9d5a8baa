"""references: the batch's pages -> chunks, tables and snippets -> the best of them for each query.

A query with more pages than `max_pages` (Task 3 brings 50) has its pages ranked first by title and snippet,
embedded with the queries in one call, and only the best `max_pages` are parsed; the others still give their
snippets. All pages to read go to the page processor at once (worker processes, cached by content); every
candidate is embedded in one call; chunks and snippets keep the cosine top-k, tables are kept best first
while they fit the table budget. With a re-ranker configured, a cross-encoder re-scores the best candidates first.

The ranking is the retriever's of `references.retriever` (models/stages/retrievers.py): dense cosine, or HASH-RAG
over propositions (models/stages/hash_retriever.py), whose declarations become this stage's.
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
from loguru import logger
from rank_bm25 import BM25Okapi

from models.retrieval.dense import best_first, select
from models.stages import hash_retriever  # noqa: F401  (registers the hash retriever)
from models.stages.retrievers import RETRIEVERS, Pool, Retriever, split_rows
from models.stages.stage import STAGES, Stage, StageContext
from models.state import QueryState, Reference
from utils.web_pages import ProcessedPage


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


def page_header(page: Mapping[str, Any]) -> str:
    """What a page is known by before it is read: its title and the search engine's snippet."""
    return " ".join(part for part in (_field(page, "page_name"), _field(page, "page_snippet")) if part)


def pages_to_read(pages: list[Mapping[str, Any]], query: np.ndarray, headers: np.ndarray, limit: int) -> set[int]:
    """The indices of the `limit` pages whose header vectors are closest to the query; every page within it."""
    if len(pages) <= limit:
        return set(range(len(pages)))
    return set(best_first(headers @ query)[:limit])


_WORD = re.compile(r"\w+")


def shortlist(query: str, refs: list[Reference], limit: int, known: Container[str] = ()) -> list[Reference]:
    """The candidates worth embedding: those whose vector is `known` (by `Reference.embedded_as`) cost nothing
    and come first; of the others at most `limit`, the best by BM25 against the query first, so that a huge page
    (thousands of chunks) costs what the deadline affords; all of them, in page order, when they are within the
    limit (docs/decisions/references-shortlist.md)."""
    free = [r for r in refs if r.embedded_as() in known]
    rest = [r for r in refs if r.embedded_as() not in known]
    if len(rest) <= limit:
        return free + rest
    scores = BM25Okapi([_WORD.findall(r.text.lower()) or [""] for r in rest]).get_scores(
        _WORD.findall(query.lower()))
    logger.info("{} candidates for {!r}: the {} best by BM25 are embedded", len(rest), query[:60], limit)
    return free + [rest[i] for i in best_first(scores)[:limit]]


def candidate_limit(settings: Any, pages_read: int) -> int:
    """How many of a query's candidates may be embedded: `max_candidates`, and `candidates_per_page` for each
    page read where that is set."""
    per_page = settings.candidates_per_page * pages_read if settings.candidates_per_page else settings.max_candidates
    return max(1, min(settings.max_candidates, per_page))


def embed_in_turn(embedder: Any, per_query: list[list[Reference]], deadline: Any,
                  known: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """The candidates' vectors, query by query, embedded in turns (each query's next best, then the next), so
    that a deadline reached half way leaves every query its best candidates: a query's block has a row for each
    of its candidates before the first one left unembedded (the others are dropped by the caller). `known`:
    vectors already computed, by `Reference.embedded_as`, which are not embedded again."""
    known = known or {}
    order = [(q, i) for i in range(max((len(r) for r in per_query), default=0))
             for q, refs in enumerate(per_query) if i < len(refs) and refs[i].embedded_as() not in known]
    vectors = embedder.encode([per_query[q][i].embedded_as() for q, i in order], deadline=deadline)
    embedded = {(q, i): row for (q, i), row in zip(order, vectors)}
    if len(vectors) < len(order):
        logger.warning("deadline: {} of {} candidates embedded; the rest are left out", len(vectors), len(order))
    blocks: list[np.ndarray] = []
    for q, refs in enumerate(per_query):
        rows = []
        for i, ref in enumerate(refs):
            row = known.get(ref.embedded_as())
            row = embedded.get((q, i)) if row is None else row
            if row is None:
                break
            rows.append(row)
        blocks.append(np.vstack(rows) if rows else np.zeros((0, vectors.shape[1]), dtype=np.float32))
    return blocks


@STAGES.register("references")
class ReferencesStage(Stage):
    """What its retrievers declare (prompts, fields, needed resources, signals) is added to its own as each registers
    (`take`), so that a retriever of a config's `stage_modules` gets what it needs, as a built-in one does."""

    sections = ("references",)
    writes = frozenset({"references", "reference_vectors", "query_vector", "candidates", "candidate_vectors"})
    needs = frozenset({"pages", "embedder", "reranker"})

    @classmethod
    def take(cls, retriever: type[Retriever]) -> None:
        cls.prompts = tuple(dict.fromkeys((*cls.prompts, *retriever.prompts)))
        cls.writes = cls.writes | {spec.name for spec in retriever.fields}
        cls.needs = cls.needs | retriever.needs
        cls.signals = {**cls.signals, **retriever.signals}

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        settings = ctx.settings
        timeout = min(settings.timeout_s, ctx.work_deadline().remaining())
        limit = settings.max_pages or max((len(s.pages) for s in states), default=0)
        ranked = [s for s in states if len(s.pages) > limit]
        headers = [page_header(page) for s in ranked for page in s.pages]
        # No deadline on this call: a ranking needs every header, and titles with snippets are short.
        vectors = ctx.resource("embedder").encode([state.query for state in states] + headers)
        queries = vectors[:len(states)]
        header_vectors = vectors[len(states):]
        header_blocks = dict(zip(map(id, ranked), split_rows(header_vectors, [len(s.pages) for s in ranked])))
        reading = [pages_to_read(s.pages, query, header_blocks[id(s)], limit) if id(s) in header_blocks
                   else set(range(len(s.pages))) for s, query in zip(states, queries)]
        if ranked:
            logger.info("{} queries have more than {} pages: the best {} by title and snippet are read",
                        len(ranked), limit, limit)
        flat = [(page.get("page_result"), _field(page, "page_name"))
                for s, read in zip(states, reading) for i, page in enumerate(s.pages) if i in read]
        done = iter(ctx.resource("pages").process(flat, timeout))
        known = dict(zip(headers, header_vectors))
        per_query: list[list[Reference]] = []
        for state, read in zip(states, reading):
            processed = [next(done) if i in read else None for i in range(len(state.pages))]
            if any(processed[i] is None for i in read):
                ctx.cut([state], "pages left unparsed")
            found = candidates(state.pages, processed, settings.use_snippets)
            per_query.append(shortlist(state.query, found, candidate_limit(settings, len(read)), known))
        blocks = embed_in_turn(ctx.resource("embedder"), per_query, ctx.work_deadline(), known)
        ctx.cut([s for s, refs, block in zip(states, per_query, blocks) if len(block) < len(refs)],
                "candidates left unembedded")
        per_query = [refs[:len(block)] for refs, block in zip(per_query, blocks)]
        retriever = RETRIEVERS.get(settings.retriever)()
        retriever.prepare(states, per_query, blocks, queries, ctx)
        for n, (state, refs, query, block) in enumerate(zip(states, per_query, queries, blocks)):
            state.candidates, state.candidate_vectors = refs, block
            state.query_vector = query
            pool = retriever.pool(n, refs, query, block, ctx)
            if ctx.resource("reranker") is not None and pool.indices:
                keep = best_first(pool.scores)[:settings.rerank.candidates]
                indices = [pool.indices[i] for i in keep]
                pool = Pool(indices, ctx.resource("reranker").score(state.query, [refs[i].text for i in indices]),
                            [pool.units[i] for i in keep] if pool.units is not None else None)
            chosen = select([refs[i] for i in pool.indices], pool.scores, settings.top_k, settings.table_budget_chars)
            state.references = [replace(refs[pool.indices[c]], score=float(pool.scores[c])) for c in chosen]
            state.reference_vectors = block[[pool.indices[c] for c in chosen]]
            retriever.kept(n, state, refs, pool, chosen, ctx)


RETRIEVERS.on_register(ReferencesStage.take)  # the built-in retrievers now, a config's own when it registers
