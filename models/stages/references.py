"""references: the batch's pages -> chunks, tables and snippets -> the best of them for each query.

All pages of the batch go to the page processor at once (worker processes, cached by content); the query and
every candidate are embedded in one call; chunks and snippets keep the cosine top-k, tables are kept best first
while they fit the table budget. With a re-ranker configured, a cross-encoder re-scores the best candidates first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from models.config import ReferencesConfig
from models.retrieval.dense import best_first, select
from models.stages.base import StageContext
from models.state import QueryState, Reference
from utils.answers import IDK
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
        texts = [state.query for state in states] + [ref.text for refs in per_query for ref in refs]
        vectors = ctx.embedder.encode(texts)
        queries, documents = vectors[:len(states)], vectors[len(states):]
        offset = 0
        for state, refs, query in zip(states, per_query, queries):
            block = documents[offset:offset + len(refs)]
            offset += len(refs)
            state.candidates, state.candidate_vectors = refs, block
            scores = block @ query
            shortlist: list[int] = []  # with a re-ranker: the candidates it scored, as indices into block
            if ctx.reranker is not None and refs:
                shortlist = best_first(scores)[:settings.rerank.candidates]
                refs = [refs[i] for i in shortlist]
                scores = ctx.reranker.score(state.query, [ref.text for ref in refs])
            chosen = select(refs, scores, settings.top_k, settings.table_budget_chars)
            state.references = [replace(refs[i], score=float(scores[i])) for i in chosen]
            state.query_vector = query
            state.reference_vectors = block[[shortlist[i] for i in chosen] if shortlist else chosen]
            if not state.references:
                state.finish(IDK, "no usable text in the search results")
