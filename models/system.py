"""CragSystem: what the grader calls. Batches queries through a strategy within the time budget."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from loguru import logger

from models.budget import Deadline
from models.config import ConfigError, SystemConfig, load_config, resolve_path
from models.llm.base import LLM, create_llm
from models.prompting import PromptLibrary
from models.retrieval.embedder import Embedder
from models.retrieval.hash_index import HashModel, load_model
from models.retrieval.r2former import R2FormerError, R2FormerHead, load_checkpoint
from models.retrieval.reranker import Reranker
from models.stages.answer import AnswerStage
from models.stages.base import StageContext, run_stage
from models.stages.references import page_settings
from models.state import QueryState
from models.strategies import STRATEGIES
from utils.answers import IDK
from utils.cache import cache_root
from utils.kg_api import KGClient
from utils.pages import PageProcessor

BATCH_FIELDS = ("interaction_id", "query", "search_results", "query_time")


class CragSystem:
    """`llm`, `embedder` and `kg` (the KG client, tasks 2 and 3) are built from the config unless given (tests
    pass fakes).

    The page workers start first, before any model loads, so that forking them copies no model or GPU state.
    """

    def __init__(self, config: SystemConfig | None = None, llm: LLM | None = None,
                 embedder: Embedder | None = None, kg: KGClient | None = None) -> None:
        self.config = config or load_config()
        if self.config.strategy not in STRATEGIES:
            raise ConfigError(f"{self.config.source}: strategy '{self.config.strategy}' is not one of {sorted(STRATEGIES)}")
        self.prompts = PromptLibrary(self.config.prompts)
        refs = self.config.references
        self.pages = PageProcessor(page_settings(refs), refs.workers,
                                   cache_root(refs.cache_dir) / "pages" if refs.cache else None)
        self.llm = llm or create_llm(self.config.llm)
        if llm is None and hasattr(self.llm, "probe"):  # a remote server: a wrong key, model or URL stops here
            self.llm.probe()
        self.embedder = embedder or Embedder(self.config.embedder)
        self.reranker = Reranker(refs.rerank) if refs.rerank.model else None
        self.r2former = self._r2former() if self.config.r2ag.enabled else None
        self.hash_model = self._hash_model() if refs.retriever == "hash" else None
        self.kg = self._kg_client(kg)
        self.strategy = STRATEGIES[self.config.strategy](self.config, self.embedder, kg=self.kg is not None)
        for stage in self.strategy.stages:  # a broken prompt file fails here, not in the first batch
            for name in stage.prompt_names:
                self.prompts.get(name)
        self.answer_stage = AnswerStage()
        self.last_batch_trace: list[dict[str, Any]] = []

    def close(self) -> None:
        """Stop the page workers (they also stop when the process exits)."""
        self.pages.close()

    def context(self, batch_size: int, prompts: PromptLibrary | None = None) -> StageContext:
        """What the stages of one batch share: this system's models and a fresh batch deadline."""
        budget = self.config.budget
        deadline = Deadline.for_batch(max(batch_size, 1), budget.per_query_s, budget.safety_margin_s)
        return StageContext(self.config, self.llm, self.embedder, prompts or self.prompts, deadline, self.pages,
                            self.reranker, self.r2former, self.kg, self.hash_model)

    def _kg_client(self, given: KGClient | None) -> KGClient | None:
        """The KG client for tasks 2 and 3 (`given`, else one whose server answered at start-up: one probe,
        logged); None for task 1 or without a server, and the strategy then has no kg stage, so no call of the
        run goes to a server that is not there."""
        if self.config.task == 1:
            return None
        if given is not None:
            return given
        kg = self.config.kg
        client = KGClient(kg.base_url, kg.connect_timeout_s, kg.read_timeout_s, kg.retries, kg.backoff_s)
        return client if client.probe() else None

    def _hash_model(self) -> HashModel:
        """The hash layer of `references.hash.model`, checked against this config's embedder."""
        path = resolve_path(self.config.references.hash.model)
        return load_model(path, embedder=getattr(self.embedder, "name", ""))

    def _r2former(self) -> R2FormerHead:
        """The R2AG head of the config. Prompt mode needs a backend that takes input embeddings and a checkpoint
        trained for this LLM's hidden size; a backend without embeddings falls back to relevance mode (logged)."""
        settings = self.config.r2ag
        prompting = settings.mode == "prompt"
        if prompting and not hasattr(self.llm, "generate_with_embeddings"):
            logger.warning("r2ag.mode prompt: the {} backend cannot take input embeddings; R2AG filters references "
                           "instead (relevance mode)", self.config.llm.backend)
            prompting = False
        path = resolve_path(settings.checkpoint)
        checkpoint = load_checkpoint(path, settings.device, self.llm.hidden_size if prompting else None)
        embedder = getattr(self.embedder, "name", "")
        if checkpoint.embedder != embedder:
            raise R2FormerError(f"{path}: trained on {checkpoint.embedder} embeddings, but the embedder is {embedder}; "
                                "retrain it with this embedder (tools/train_r2former.py)")
        if prompting:
            self.llm.retrieval_placeholder()  # the token joins the vocabulary now, not inside a batch
        return R2FormerHead(checkpoint, settings.device, prompting)

    def get_batch_size(self) -> int:
        return self.config.batch_size

    def batch_generate_answer(self, batch: Mapping[str, Any]) -> list[str]:
        """One answer per query, in input order; a query that fails answers "i don't know"."""
        states = unpack_batch(batch)
        ctx = self.context(len(states))
        try:
            self.strategy.run(states, ctx)
        except Exception as err:  # a strategy bug: every open query still gets a safe answer below
            logger.opt(exception=err).error("strategy {} failed: {}", self.config.strategy, err)
            for state in states:
                if not state.done:
                    state.finish(IDK, f"strategy failed: {type(err).__name__}")
        run_stage(self.answer_stage, states, ctx, always=True)
        self.last_batch_trace = [{"interaction_id": s.interaction_id, "reason": s.done_reason,
                                  "stages": [asdict(r) for r in s.trace], "route": s.route, "steps": s.steps,
                                  "sub_queries": s.sub_queries} for s in states]
        for state in states:
            if state.done_reason:
                logger.info("{} answered '{}': {}", state.interaction_id, state.answer, state.done_reason)
        return [state.answer or IDK for state in states]


def unpack_batch(batch: Any) -> list[QueryState]:
    """One state per position; malformed entries are finished as IDK with the reason, never raised."""
    if not isinstance(batch, Mapping):
        logger.error("batch is a {}, not a mapping: nothing to answer", type(batch).__name__)
        return []
    lengths = {key: len(batch[key]) for key in BATCH_FIELDS if isinstance(batch.get(key), list)}
    queries = batch.get("query")
    size = len(queries) if isinstance(queries, list) else max(lengths.values(), default=0)
    if any(length != size for length in lengths.values()) or len(lengths) < len(BATCH_FIELDS):
        logger.error("malformed batch, field lengths {} (missing fields count as absent); answering {} queries",
                     lengths, size)
    states = []
    for index in range(size):
        item = {key: batch[key][index] if index < lengths.get(key, 0) else None for key in BATCH_FIELDS}
        interaction_id = item["interaction_id"] if isinstance(item["interaction_id"], str) else f"#{index}"
        pages = item["search_results"] if isinstance(item["search_results"], list) else []
        state = QueryState(index, interaction_id, item["query"] if isinstance(item["query"], str) else "",
                           item["query_time"] if isinstance(item["query_time"], str) else "",
                           [page for page in pages if isinstance(page, Mapping)])
        if not state.query.strip():
            state.finish(IDK, "query missing or empty")
        elif not isinstance(item["search_results"], list):
            logger.warning("{}: search_results is not a list; answering without pages", interaction_id)
        states.append(state)
    return states
