"""The cross-encoder re-ranker on real weights: MiniLM loaded as a CrossEncoder (its head is untrained, so only
the plumbing is checked here, not the quality of the order)."""

import numpy as np

from models.config import RerankConfig
from models.retrieval.embedder import packaged_minilm
from models.retrieval.reranker import Reranker
from models.system import CragSystem
from tests.conftest import to_batch


def test_reranker_scores_pairs_deterministically():
    reranker = Reranker(RerankConfig(model=str(packaged_minilm()), batch_size=2))
    texts = ["Paris is the capital of France.", "Bananas are yellow.", "The Seine flows through Paris."]
    scores = reranker.score("capital of france", texts)
    assert scores.shape == (3,) and np.isfinite(scores).all()
    assert np.allclose(scores, reranker.score("capital of france", texts))
    assert reranker.score("q", []).shape == (0,)


def test_system_with_reranker_answers(cpu_config, hf_llm, embedder, sample_examples):
    cpu_config.references.rerank.model = str(packaged_minilm())
    cpu_config.references.rerank.candidates = 5
    system = CragSystem(cpu_config, llm=hf_llm, embedder=embedder)
    try:
        answers = system.batch_generate_answer(to_batch(sample_examples[:2]))
    finally:
        system.close()
    assert system.reranker is not None and len(answers) == 2 and all(answers)
    for trace in system.last_batch_trace:
        assert {r["stage"]: r["status"] for r in trace["stages"]}["references"] == "ok"
