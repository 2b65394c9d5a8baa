"""HASH-RAG as a retriever of the references stage (`references.retriever: hash`, docs/methods/hash-rag.md): each
candidate is split into propositions (embedded in a second call); a hash index of the query's propositions ranks
the candidates by their best proposition, and the propositions of the kept references go to `PROPOSITIONS`
for the PGCC prompt. With `hash.units: llm` the LLM first rewrites each query's best chunks as propositions (one
backend call for the batch).

Everything it adds is declared here: the `references.hash` keys, the `hash_model` resource (the trained hash layer),
the `propositions` field and the `propositions` prompt."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from annotated_types import Ge
from loguru import logger

from models.config import SystemConfig, resolve_path
from models.prompting import PromptLibrary
from models.resources import Resource
from models.retrieval.dense import best_first
from models.retrieval.hash_index import HashEngine, HashIndex, HashIndexError, HashModel, SearchSettings, load_model
from models.stages.retrievers import RETRIEVERS, Pool, Retriever, split_rows
from models.stages.stage import StageContext
from models.state import Evidence, QueryState, Reference, StateField
from utils.chunking import sentence_units


@dataclass
class HashSettings:
    """HASH-RAG retrieval (`references.retriever: hash`, docs/methods/hash-rag.md): candidates are split into
    propositions, searched by Hamming distance, re-ranked, and each source chunk keeps its best proposition."""

    model: str | None = None
    """An index file from tools/train_hash.py (its hash layer, trained on this config's embedder); needed with
    references.retriever hash."""
    engine: HashEngine = "numpy"
    """The Hamming search: numpy (popcount, widening radius), faiss-flat or faiss-hnsw."""
    alpha: Annotated[int, Ge(1)] = 200
    """Propositions taken nearest by Hamming distance."""
    depth: Annotated[int, Ge(1)] = 100
    """Of those, the best kept by the asymmetric score <v_q, h_p>."""
    exact: bool = True
    """Order the kept propositions by cosine (false: by <v_q, h_p>)."""
    units: Literal["sentence", "llm"] = "sentence"
    """Propositions: sentence (sentences, a short one joined to the next) or llm (the LLM rewrites the best chunks,
    prompts/propositions.yaml)."""
    min_unit_chars: int = 30
    """A sentence shorter than this many characters joins the next."""
    propositions: int = 10
    """The most propositions per query kept for the PGCC prompt (prompts/pgcc.yaml)."""
    llm_chunks: int = 10
    """units llm: the best chunks of each query (by cosine) the LLM rewrites; the others, and chunks without usable
    output, are split into sentences."""
    llm_max_tokens: int = 160
    """units llm: reply tokens per rewritten chunk."""


@dataclass
class HashKeys:
    """HASH-RAG's keys of the `references` section."""

    hash: HashSettings = field(default_factory=HashSettings)
    """HASH-RAG settings, used with retriever hash."""

    def check(self, config: SystemConfig) -> None:
        if config.references.retriever == "hash" and not self.hash.model:
            raise ValueError("references.retriever hash needs references.hash.model (train one with "
                             "tools/train_hash.py)")


def hash_settings(config: SystemConfig) -> HashSettings:
    """The config's `references.hash`."""
    return config.section("references", HashKeys).hash


@dataclass
class Proposition:
    """HASH-RAG: a short fact the hash index retrieved, and the reference (1-based) it came from."""

    id: int          # its id in the query's hash index
    text: str
    reference: int
    page_name: str = ""
    score: float = 0.0


def proposition_units(refs: list[Reference], config: HashSettings, rewritten: dict[int, list[str]] | None = None
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
    settings = ctx.section("references", HashKeys).hash
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
    return [{i: read_propositions(samples[0].text) if samples else [] for i, samples in zip(chosen, outputs)}
            for chosen in picked]


def hash_pool(model: HashModel | None, config: HashSettings, query: np.ndarray, unit_vectors: np.ndarray,
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
    settings = hash_settings(config)
    if config.references.retriever != "hash" or not settings.model:
        return None
    return load_model(resolve_path(settings.model), embedder=getattr(built.get("embedder"), "name", ""))


PROPOSITIONS = StateField[list[Proposition]](
    "propositions", list, load=lambda rows: [Proposition(**row) for row in rows],
    evidence=Evidence("Key propositions", "proposition", listed=False),
    doc="the propositions that selected the references, for the PGCC prompt (empty with dense retrieval)")


@RETRIEVERS.register("hash")
class HashRetriever(Retriever):
    settings = HashKeys
    fields = (PROPOSITIONS,)
    resources = {"hash_model": Resource(build_hash_model, ("embedder",), "HASH-RAG's hash layer (retriever hash only)",
                                        sections=("references",))}
    prompts = ("propositions",)  # used only with references.hash.units: llm
    needs = frozenset({"hash_model", "llm"})

    def prepare(self, states: list[QueryState], per_query: list[list[Reference]], blocks: list[np.ndarray],
                queries: np.ndarray, ctx: StageContext) -> None:
        settings = ctx.section("references", HashKeys).hash
        rewritten = (rewrite_as_propositions(states, per_query, [b @ q for b, q in zip(blocks, queries)], ctx)
                     if settings.units == "llm" else [{} for _ in states])
        self.units = [proposition_units(refs, settings, r) for refs, r in zip(per_query, rewritten)]
        unit_vectors = ctx.resource("embedder").encode([text for texts, _ in self.units for text in texts])
        self.unit_blocks = split_rows(unit_vectors, [len(texts) for texts, _ in self.units])

    def pool(self, number: int, refs: list[Reference], query: np.ndarray, block: np.ndarray,
             ctx: StageContext) -> Pool:
        _, sources = self.units[number]
        return hash_pool(ctx.resource("hash_model"), ctx.section("references", HashKeys).hash, query,
                         self.unit_blocks[number], sources)

    def kept(self, number: int, state: QueryState, refs: list[Reference], pool: Pool, chosen: list[int],
             ctx: StageContext) -> None:
        unit_texts, _ = self.units[number]
        units = pool.units or []
        shown = ctx.section("references", HashKeys).hash.propositions
        state[PROPOSITIONS] = [Proposition(units[c], unit_texts[units[c]], rank + 1, refs[pool.indices[c]].page_name,
                                          float(pool.scores[c])) for rank, c in enumerate(chosen[:shown])]
