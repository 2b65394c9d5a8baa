"""references: the batch's pages -> chunks, tables and snippets -> the best of them for each query.

A query with more pages than `max_pages` (Task 3 brings 50) has its pages ranked first by title and snippet,
embedded with the queries in one call, and only the best `max_pages` are parsed; the others still give their
snippets. All pages to read go to the page processor at once (worker processes, cached by content); every
candidate is embedded in one call; chunks and snippets keep the cosine top-k, tables are kept best first
while they fit the table budget. With a re-ranker configured, a cross-encoder re-scores the best candidates first.

With `retriever: hash` (HASH-RAG), each candidate is split into propositions (embedded in a second call); a hash
index of the query's propositions ranks the candidates by their best proposition, and the propositions of the
kept references go to `state.propositions` for the PGCC prompt. With `hash.units: llm` the LLM first rewrites each
query's best chunks as propositions (one backend call for the batch).
"""

from __future__ import annotations

import re
from collections.abc import Container, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from loguru import logger
from rank_bm25 import BM25Okapi

from models.config import HashConfig, SystemConfig, resolve_path
from models.prompting import PromptLibrary
from models.resources import Resource
from models.retrieval.dense import best_first, select
from models.retrieval.hash_index import HashIndex, HashIndexError, HashModel, SearchSettings, load_model
from models.stages.stage import STAGES, Stage, StageContext
from models.state import Proposition, QueryState, Reference
from utils.chunking import sentence_units
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


def split_rows(rows: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """Consecutive blocks of `rows`, of the given sizes."""
    return np.split(rows, np.cumsum(sizes)[:-1]) if sizes else []


@dataclass
class Pool:
    """A query's ranked pool: candidate indices, their scores, and (hash retrieval) the best unit of each."""

    indices: list[int]
    scores: np.ndarray
    units: list[int] | None = None


def proposition_units(refs: list[Reference], config: HashConfig, rewritten: dict[int, list[str]] | None = None
                      ) -> tuple[list[str], list[int]]:
    """The propositions of a query's candidates and the candidate each came from: a table is one unit, a chunk
    the LLM rewrote (`rewritten`, by candidate index) has its lines, any other is split into sentences."""
    texts: list[str] = []
    sources: list[int] = []
    for i, ref in enumerate(refs):
        if ref.kind == "table":
            units = [ref.text]
        else:
            units = (rewritten or {}).get(i) or sentence_units(ref.text, config.min_unit_chars, len(ref.text))
        texts += units
        sources += [i] * len(units)
    return texts, sources


_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*")
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")


def read_propositions(output: str) -> list[str]:
    """The proposition lines of an LLM's output, bullets and numbering removed; lines without a word dropped."""
    lines = (_BULLET.sub("", line).strip() for line in output.splitlines())
    return [line for line in lines if _LETTER_OR_DIGIT.search(line)]


def rewrite_as_propositions(states: list[QueryState], per_query: list[list[Reference]], scores: list[np.ndarray],
                            ctx: StageContext) -> list[dict[int, list[str]]]:
    """LLM propositions for the `llm_chunks` best chunks (by cosine) of each query (`per_query` and `scores` are
    aligned with `states`), in one backend call. A failed call leaves every chunk to the sentence splitter, with
    the reason logged."""
    settings = ctx.settings.hash
    picked = [[i for i in best_first(query_scores) if refs[i].kind != "table"][:settings.llm_chunks]
              for refs, query_scores in zip(per_query, scores)]
    prompt = ctx.prompt("propositions")
    conversations = [prompt.render(page_name=refs[i].page_name, text=refs[i].text)
                     for refs, chosen in zip(per_query, picked) for i in chosen]
    owners = [state for state, chosen in zip(states, picked) for _ in chosen]
    if not conversations:
        return [{} for _ in per_query]
    try:
        outputs = iter(ctx.generate(conversations, owners=owners, max_tokens=settings.llm_max_tokens))
    except Exception as err:  # the retriever still works on sentences: never fail the batch for this
        logger.opt(exception=err).warning("proposition extraction failed, chunks are split into sentences: {}", err)
        return [{} for _ in per_query]
    return [{i: read_propositions(samples[0]) if samples else [] for i, samples in zip(chosen, outputs)}
            for chosen in picked]


def hash_pool(model: HashModel | None, config: HashConfig, query: np.ndarray, unit_vectors: np.ndarray,
              sources: list[int]) -> Pool:
    """The candidates that the query's propositions reach through a HASH-RAG index of them, best first."""
    if model is None:
        raise HashIndexError("references.retriever is hash, but no hash model was loaded (references.hash.model)")
    index = HashIndex(model, config.engine)
    index.add(unit_vectors, sources, keep_vectors=config.exact)
    hits = index.search(query, len(set(sources)), SearchSettings(config.alpha, config.depth, config.exact))[0]
    return Pool([h.source for h in hits], np.array([h.score for h in hits], dtype=np.float32),
                [h.unit for h in hits])


def build_hash_model(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> HashModel | None:
    """The hash layer of `references.hash.model` (retriever hash only), checked against the embedder."""
    if config.references.retriever != "hash" or not config.references.hash.model:
        return None
    return load_model(resolve_path(config.references.hash.model), embedder=getattr(built.get("embedder"), "name", ""))


@STAGES.register("references")
class ReferencesStage(Stage):
    prompts = ("propositions",)  # used only with references.hash.units: llm
    sections = ("references",)
    writes = frozenset({"references", "reference_vectors", "query_vector", "candidates", "candidate_vectors",
                        "propositions"})
    resources = {"hash_model": Resource(build_hash_model, ("embedder",), "HASH-RAG's hash layer (retriever hash only)")}
    needs = frozenset({"pages", "embedder", "reranker", "hash_model", "llm"})

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
            found = candidates(state.pages, processed, settings.use_snippets)
            per_query.append(shortlist(state.query, found, candidate_limit(settings, len(read)), known))
        blocks = embed_in_turn(ctx.resource("embedder"), per_query, ctx.work_deadline(), known)
        per_query = [refs[:len(block)] for refs, block in zip(per_query, blocks)]
        hashing = settings.retriever == "hash"
        if hashing:
            rewritten = (rewrite_as_propositions(states, per_query, [b @ q for b, q in zip(blocks, queries)], ctx)
                         if settings.hash.units == "llm" else [{} for _ in states])
            units = [proposition_units(refs, settings.hash, r) for refs, r in zip(per_query, rewritten)]
            unit_vectors = ctx.resource("embedder").encode([text for texts, _ in units for text in texts])
            unit_blocks = split_rows(unit_vectors, [len(texts) for texts, _ in units])
        for n, (state, refs, query, block) in enumerate(zip(states, per_query, queries, blocks)):
            state.candidates, state.candidate_vectors = refs, block
            state.query_vector = query
            if hashing:
                unit_texts, sources = units[n]
                pool = hash_pool(ctx.resource("hash_model"), settings.hash, query, unit_blocks[n], sources)
            else:
                pool = Pool(list(range(len(refs))), block @ query)
            if ctx.resource("reranker") is not None and pool.indices:
                keep = best_first(pool.scores)[:settings.rerank.candidates]
                indices = [pool.indices[i] for i in keep]
                pool = Pool(indices, ctx.resource("reranker").score(state.query, [refs[i].text for i in indices]),
                            [pool.units[i] for i in keep] if pool.units is not None else None)
            chosen = select([refs[i] for i in pool.indices], pool.scores, settings.top_k, settings.table_budget_chars)
            state.references = [replace(refs[pool.indices[c]], score=float(pool.scores[c])) for c in chosen]
            state.reference_vectors = block[[pool.indices[c] for c in chosen]]
            if pool.units is not None:
                state.propositions = [Proposition(pool.units[c], unit_texts[pool.units[c]], rank + 1,
                                                  refs[pool.indices[c]].page_name, float(pool.scores[c]))
                                      for rank, c in enumerate(chosen[:settings.hash.propositions])]
