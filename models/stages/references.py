"""references: pages -> chunks (+ snippets) -> cosine top-k per query, embedded in one call per batch."""

from __future__ import annotations

from dataclasses import replace

from models.retrieval.dense import top_k
from models.stages.base import StageContext
from models.state import QueryState, Reference
from utils.answers import IDK
from utils.pages import page_text


class ReferencesStage:
    name = "references"
    prompt_names: tuple[str, ...] = ()

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        settings = ctx.config.references
        candidates = [self._candidates(state, ctx) for state in states]
        texts = [state.query for state in states] + [ref.text for refs in candidates for ref in refs]
        vectors = ctx.embedder.encode(texts)
        queries, documents = vectors[:len(states)], vectors[len(states):]
        offset = 0
        for state, refs, query in zip(states, candidates, queries):
            block = documents[offset:offset + len(refs)]
            offset += len(refs)
            state.references = [replace(refs[i], score=score) for i, score in top_k(query, block, settings.top_k)]
            if not state.references:
                state.finish(IDK, "no usable text in the search results")

    @staticmethod
    def _candidates(state: QueryState, ctx: StageContext) -> list[Reference]:
        settings = ctx.config.references
        refs: list[Reference] = []
        seen: set[str] = set()
        for page in state.pages:
            text = page_text(page, settings.chunk_chars, settings.max_page_chars)
            pieces = [(chunk, "chunk") for chunk in text.chunks]
            if settings.use_snippets and text.snippet:
                pieces.append((text.snippet, "snippet"))
            for piece, kind in pieces:
                if piece not in seen:
                    seen.add(piece)
                    refs.append(Reference(piece, kind, text.name, text.url, text.last_modified))
        return refs
