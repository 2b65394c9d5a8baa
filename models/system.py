"""CragSystem: what the grader calls. Batches queries through the config's strategy within the time budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from loguru import logger

from models.config import SystemConfig, load_config
from models.gate.gate_stage import GateStage
from models.kg.client import KGClient
from models.llm.backend import LLM, Closable
from models.prompting import PromptLibrary
from models.resources import build_resources
from models.stages import Stage, pipeline_stages
from models.stages.answer import AnswerStage
from models.stages.stage import Batch, run_stage
from models.state import QueryState
from utils.answers import IDK
from utils.batch import BATCH_FIELDS, BatchResult


class CragSystem:
    """Builds the strategy's stages and only the resources they need. `llm`, `embedder` and `kg` (the KG client,
    tasks 2 and 3) are built from the config unless given (tests pass fakes); batch deadlines are read on `clock`."""

    def __init__(self, config: SystemConfig | None = None, llm: LLM | None = None,
                 embedder: Any | None = None, kg: KGClient | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or load_config()
        self.clock = clock
        self.prompts = PromptLibrary(self.config.prompts)
        classes = pipeline_stages(self.config)
        for name in {name for cls in classes for name in cls.prompts}:  # a broken prompt file fails before any
            self.prompts.get(name)                                      # model loads, not in the first batch
        # every query leaves by the answer step, and then the answer gate where the config names one
        closing = [AnswerStage, *([GateStage] if GateStage.active(self.config) else [])]
        needed = {name for cls in [*classes, *closing] for name in cls.needs}
        given = {"llm": llm, "embedder": embedder, "kg": kg}
        self.resources = build_resources(self.config, self.prompts, needed, given)
        if "kg" in needed and self.resources.get("kg") is None:  # no server answered: no KG stage, no KG call
            classes = pipeline_stages(self.config, missing=frozenset({"kg"}))
        self.pipeline: list[Stage] = [cls() for cls in classes]
        for stage in self.pipeline:
            stage.setup(self.config, {name: self.resources.get(name) for name in stage.needs})
        self.answer_stage = AnswerStage()
        self.gate_stage = GateStage() if GateStage in closing else None
        logger.info("strategy {}: {}", self.config.strategy, " -> ".join(s.name for s in self.pipeline))
        if self.gate is not None:
            logger.info("answer gate {}: an answer with P(correct) under {:.3f} becomes \"i don't know\"",
                        self.config.answer.gate, self.gate.threshold)

    # The resources by name, for tools and tests (None when no chosen stage needs one, or the config leaves it out).
    llm = property(lambda self: self.resources.get("llm"))
    embedder = property(lambda self: self.resources.get("embedder"))
    pages = property(lambda self: self.resources.get("pages"))
    kg = property(lambda self: self.resources.get("kg"))
    reranker = property(lambda self: self.resources.get("reranker"))
    r2former = property(lambda self: self.resources.get("r2former"))
    gate = property(lambda self: self.resources.get("gate"))

    def close(self) -> None:
        """Stop the page workers and an in-process engine (both also stop when the process exits)."""
        if self.pages is not None:
            self.pages.close()
        if isinstance(self.llm, Closable):
            self.llm.close()

    def batch(self, size: int, prompts: PromptLibrary | None = None) -> Batch:
        """What the stages of one batch share: this system's resources and a fresh batch deadline."""
        return Batch.start(self.config, size, prompts or self.prompts, self.resources, self.clock)

    def get_batch_size(self) -> int:
        return self.config.batch_size

    def batch_generate_answer(self, batch: Mapping[str, Any]) -> list[str]:
        """One answer per query, in input order; a query that fails answers "i don't know" (the grader's call)."""
        return self.answer_batch(batch).answers

    def answer_batch(self, batch: Mapping[str, Any]) -> BatchResult:
        """The answers of batch_generate_answer with each query's trace record (what the harness reads)."""
        states = unpack_batch(batch)
        shared = self.batch(len(states))
        try:
            for stage in self.pipeline:
                run_stage(stage, states, shared)
        except Exception as err:  # a runner bug: every open query still gets a safe answer below
            logger.opt(exception=err).error("strategy {} failed: {}", self.config.strategy, err)
            for state in states:
                if not state.done:
                    state.finish(IDK, f"strategy failed: {type(err).__name__}")
        run_stage(self.answer_stage, states, shared, always=True)
        if self.gate_stage is not None:
            run_stage(self.gate_stage, states, shared, always=True)
        for state in states:
            if state.done_reason:
                logger.info("{} answered '{}': {}", state.interaction_id, state.answer, state.done_reason)
        return BatchResult([state.answer or IDK for state in states], [state.record() for state in states])


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
