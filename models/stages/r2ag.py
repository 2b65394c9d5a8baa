"""r2ag: the R2-Former reads each query's ranked references (R2AG), between retrieval and the LLM stages.

Relevance mode re-orders the references by query-document-matching probability and drops those under the
threshold (the best `min_keep` always stay). Prompt mode keeps the retriever's list and stores its retrieval
features, which the reasoning stage turns into embeddings before each reference.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from annotated_types import Ge, Interval
from loguru import logger

from models.config import SystemConfig, resolve_path
from models.llm.backend import TakesEmbeddings
from models.prompting import PromptLibrary
from models.resources import Resource
from models.stages.stage import STAGES, Stage, StageContext
from models.state import QueryState, StateField

if TYPE_CHECKING:  # the head imports torch: loaded when R2AG is on, not with the config
    from models.retrieval.r2former_head import R2FormerHead


@dataclass
class R2AGSettings:
    """R2AG (docs/methods/r2ag.md): an R2-Former reads the retrieval features of each query's ranked references."""

    enabled: bool = False
    """Run the R2-Former (needs checkpoint); off by default, as no checkpoint ships."""
    checkpoint: str | None = None
    """An R2-Former written by tools/train_r2former.py, trained with this config's embedder."""
    mode: Literal["relevance", "prompt"] = "relevance"
    """relevance: re-order and filter the references by query-document-matching probability (any backend); prompt:
    inject a retrieval embedding before each reference (hf, or vllm with enable_prompt_embeds; else relevance)."""
    threshold: Annotated[float, Interval(ge=0, le=1)] = 0.5
    """relevance mode: references under this probability are dropped (but see min_keep)."""
    min_keep: Annotated[int, Ge(0)] = 3
    """relevance mode: the best min_keep references always stay."""
    device: str = "cpu"
    """torch device; cpu also beside GPUs: the R2-Former is small, and the GPUs stay the LLM's."""

    def __post_init__(self) -> None:
        if self.enabled and not self.checkpoint:
            raise ValueError("r2ag.enabled needs r2ag.checkpoint (train one with tools/train_r2former.py)")

    def check(self, config: SystemConfig) -> None:
        if self.enabled and self.mode == "prompt" and not config.reasoning.max_tokens:
            raise ValueError("r2ag.mode prompt puts its embeddings into the reasoning prompt, which "
                             "reasoning.max_tokens 0 turns off; set reasoning.max_tokens, or r2ag.mode relevance")


def build_r2former(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> R2FormerHead | None:
    """The R2AG head of the config (r2ag.enabled only). Prompt mode needs a backend that takes input embeddings and a
    checkpoint trained for this LLM's hidden size; a backend without embeddings falls back to relevance mode
    (logged)."""
    settings = config.section("r2ag", R2AGSettings)
    if not settings.enabled:
        return None
    from models.retrieval.r2former_head import R2FormerError, R2FormerHead, load_checkpoint

    llm = built["llm"]
    prompting = settings.mode == "prompt"
    if prompting and not isinstance(llm, TakesEmbeddings):
        logger.warning("r2ag.mode prompt: the {} backend cannot take input embeddings; R2AG filters references "
                       "instead (relevance mode)", config.llm.backend)
        prompting = False
    if not settings.checkpoint:  # R2AGSettings refuses this at load; a config changed in code may not
        raise R2FormerError("r2ag.enabled needs r2ag.checkpoint (train one with tools/train_r2former.py)")
    path = resolve_path(settings.checkpoint)
    checkpoint = load_checkpoint(path, settings.device, llm.hidden_size if prompting else None)
    embedder = getattr(built["embedder"], "name", "")
    if checkpoint.embedder != embedder:
        raise R2FormerError(f"{path}: trained on {checkpoint.embedder} embeddings, but the embedder is {embedder}; "
                            "retrain it with this embedder (tools/train_r2former.py)")
    if prompting:
        llm.retrieval_placeholder()  # the token joins the vocabulary now, not inside a batch
    return R2FormerHead(checkpoint, settings.device, prompting)


def relevance_order(probabilities: np.ndarray, threshold: float, min_keep: int) -> list[int]:
    """Indices by descending probability (ties keep the retriever's order): those at or over `threshold`, and at
    least the best `min_keep`."""
    order = [int(i) for i in np.argsort(-probabilities, kind="stable")]
    passing = sum(1 for i in order if probabilities[i] >= threshold)
    return order[:max(passing, min(min_keep, len(order)))]


RETRIEVAL_FEATURES = StateField[list[list[float]] | None](
    "retrieval_features", lambda: None,
    doc="prompt mode: (relevance, precedent, neighbour) per reference, aligned with `references`")


@STAGES.register("r2ag")
class R2AGStage(Stage):
    settings = R2AGSettings
    fields = (RETRIEVAL_FEATURES,)
    resources = {"r2former": Resource(build_r2former, ("llm", "embedder"), "the R2AG head (r2ag.enabled only)",
                                       sections=("r2ag", "llm"))}
    reads = frozenset({"references", "reference_vectors", "query_vector"})
    writes = frozenset({"references", "reference_vectors", "retrieval_features"})
    needs = frozenset({"r2former"})
    switch_on = ("r2ag.enabled=true",)

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        return config.section("r2ag", R2AGSettings).enabled

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        head, settings = ctx.resource("r2former"), ctx.settings
        if head is None:
            raise RuntimeError("r2ag stage without an R2-Former head")
        scored = [(s, s.query_vector, s.reference_vectors) for s in states
                  if s.references and s.query_vector is not None and s.reference_vectors is not None
                  and len(s.reference_vectors) == len(s.references)]
        with_vectors = {id(s) for s, _, _ in scored}
        for state in states:
            if state.references and id(state) not in with_vectors:
                logger.warning("{}: references carry no embeddings; R2AG leaves them as ranked", state.interaction_id)
        from models.retrieval.r2former_head import retrieval_features

        features = [retrieval_features(query, rows) for _, query, rows in scored]
        probabilities, _ = head.run(features)
        for (state, _, rows), feats, probs in zip(scored, features, probabilities):
            refs = [replace(ref, relevance=float(p)) for ref, p in zip(state.references, probs)]
            if head.prompting:
                state.references = refs
                state[RETRIEVAL_FEATURES] = feats.tolist()
                continue
            kept = relevance_order(probs, settings.threshold, settings.min_keep)
            state.references = [refs[i] for i in kept]
            state.reference_vectors = rows[kept]
            logger.debug("{}: R2AG kept {} of {} references", state.interaction_id, len(kept), len(refs))
