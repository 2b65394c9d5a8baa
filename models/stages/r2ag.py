"""r2ag: the R2-Former reads each query's ranked references (R2AG), between retrieval and the LLM stages.

Relevance mode re-orders the references by query-document-matching probability and drops those under the
threshold (the best `min_keep` always stay). Prompt mode keeps the retriever's list and stores its retrieval
features, which the reasoning stage turns into embeddings before each reference.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from loguru import logger

from models.config import SystemConfig
from models.retrieval.r2former_head import retrieval_features
from models.stages.stage import STAGES, Stage, StageContext
from models.state import QueryState


def relevance_order(probabilities: np.ndarray, threshold: float, min_keep: int) -> list[int]:
    """Indices by descending probability (ties keep the retriever's order): those at or over `threshold`, and at
    least the best `min_keep`."""
    order = [int(i) for i in np.argsort(-probabilities, kind="stable")]
    passing = sum(1 for i in order if probabilities[i] >= threshold)
    return order[:max(passing, min(min_keep, len(order)))]


@STAGES.register("r2ag")
class R2AGStage(Stage):
    sections = ("r2ag",)
    reads = frozenset({"references", "reference_vectors", "query_vector"})
    writes = frozenset({"references", "reference_vectors", "retrieval_features"})
    needs = frozenset({"r2former"})

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        return config.r2ag.enabled

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        head, settings = ctx.r2former, ctx.settings
        if head is None:
            raise RuntimeError("r2ag stage without an R2-Former head")
        scored = [s for s in states if s.references and s.reference_vectors is not None
                  and len(s.reference_vectors) == len(s.references)]
        with_vectors = {id(s) for s in scored}
        for state in states:
            if state.references and id(state) not in with_vectors:
                logger.warning("{}: references carry no embeddings; R2AG leaves them as ranked", state.interaction_id)
        features = [retrieval_features(s.query_vector, s.reference_vectors) for s in scored]
        probabilities, _ = head.run(features)
        for state, feats, probs in zip(scored, features, probabilities):
            refs = [replace(ref, relevance=float(p)) for ref, p in zip(state.references, probs)]
            if head.prompting:
                state.references = refs
                state.retrieval_features = feats.tolist()
                continue
            kept = relevance_order(probs, settings.threshold, settings.min_keep)
            state.references = [refs[i] for i in kept]
            state.reference_vectors = state.reference_vectors[kept]
            logger.debug("{}: R2AG kept {} of {} references", state.interaction_id, len(kept), len(refs))
