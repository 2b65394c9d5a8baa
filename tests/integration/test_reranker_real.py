"""The cross-encoder re-ranker on real weights: MiniLM loaded as a CrossEncoder. Its head is untrained, so no
relevance is asserted; what is: each score belongs to its own (query, text) pair, and the references stage
orders and keeps what the re-ranker's scores say, not what the embedder's cosine says."""

from __future__ import annotations

import numpy as np

from models.config import RerankConfig
from models.retrieval.dense import best_first
from models.retrieval.embedder import packaged_minilm
from models.retrieval.reranker import Reranker
from models.stages.stage import run_alone
from models.system import CragSystem, unpack_batch
from tests.conftest import stage_of, to_batch

TEXTS = ["Paris is the capital of France.", "Bananas are yellow.", "The Seine flows through Paris.",
         "France borders Spain and Belgium.", "Rust is a systems programming language."]


def test_each_score_is_its_own_pairs():
    reranker = Reranker(RerankConfig(model=str(packaged_minilm()), batch_size=2))
    scores = reranker.score("capital of france", TEXTS)
    assert scores.shape == (len(TEXTS),) and np.isfinite(scores).all() and len(set(scores.tolist())) == len(TEXTS)
    # in another order, in other batches, or one at a time: each text keeps its score
    order = [3, 0, 4, 2, 1]
    assert np.allclose(reranker.score("capital of france", [TEXTS[i] for i in order]), scores[order], atol=1e-5)
    alone = np.array([reranker.score("capital of france", [text])[0] for text in TEXTS])
    assert np.allclose(alone, scores, atol=1e-5)
    assert not np.allclose(reranker.score("bananas", TEXTS), scores)  # the query is read
    assert reranker.score("q", []).shape == (0,)


def test_the_references_stage_keeps_the_re_ranker_s_order(cpu_config, hf_llm, embedder, sample_examples):
    cpu_config.references.rerank.model = str(packaged_minilm())
    cpu_config.references.rerank.candidates = 5
    cpu_config.references.top_k = 3
    system = CragSystem(cpu_config, llm=hf_llm, embedder=embedder)
    scored: list[tuple[str, list[str], np.ndarray]] = []
    score = system.resource("reranker").score

    def recording(query: str, texts: list[str]) -> np.ndarray:
        scored.append((query, texts, score(query, texts)))
        return scored[-1][2]

    system.resource("reranker").score = recording
    states = unpack_batch(to_batch(sample_examples[:3]))
    try:
        run_alone(stage_of(system, "references"), states, cpu_config, system.resources)
    finally:
        system.close()
    assert [query for query, _, _ in scored] == [state.query for state in states]
    reordered = 0
    for state, (_, texts, scores) in zip(states, scored):
        # the re-ranker scores the 5 best by cosine, best first; the stage keeps its 3 best texts (and the best
        # tables that fit), in its order, with its scores
        cosine = state.candidate_vectors @ state.query_vector
        assert len(texts) == 5 and texts == [state.candidates[i].text for i in best_first(cosine)[:5]]
        kinds = {candidate.text: candidate.kind for candidate in state.candidates}
        by_reranker = [texts[i] for i in best_first(scores) if kinds[texts[i]] != "table"]
        assert [r.text for r in state.references if r.kind != "table"] == by_reranker[:3]
        assert [r.score for r in state.references] == sorted((r.score for r in state.references), reverse=True)
        assert all(np.isclose(r.score, scores[texts.index(r.text)]) for r in state.references)
        reordered += best_first(scores) != list(range(5))
    assert reordered  # the re-ranker's order is not the cosine's on some query: the stage above followed it
