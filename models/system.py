"""CragSystem: what the grader calls. Batches queries through the config's strategy within the time budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from loguru import logger

from models.config import SystemConfig
from models.llm.backend import LLM, Closable
from models.loading import closing_stages, load_config, pipeline_stages
from models.prompting import PromptLibrary
from models.resources import RESOURCES, build_resources
from models.stages import STAGES, Stage
from models.stages.answer import AnswerStage
from models.stages.stage import Batch, run_stage
from models.state import QueryState
from utils.answers import IDK
from utils.batch import BATCH_FIELDS, BatchResult, id_text
from utils.html import clean_text


class CragSystem:
    """Builds the strategy's stages and only the resources they need. `llm`, `embedder` and the resources in `given`
    (by name; tests pass fakes) are used as they are, the others built from the config; batch deadlines are read
    on `clock`."""

    def __init__(self, config: SystemConfig | None = None, llm: LLM | None = None,
                 embedder: Any | None = None, given: Mapping[str, Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or load_config()
        self.clock = clock
        self.prompts = PromptLibrary(self.config.prompts)
        classes = pipeline_stages(self.config)
        # every query leaves by the answer step, and then by the closing stages the config switches on
        closing = closing_stages(self.config)
        for name in {name for cls in [*classes, *closing] for name in cls.prompts}:  # a broken prompt file fails
            self.prompts.get(name)                                        # before any model loads, not in a batch
        every: list[type[Stage]] = [*classes, AnswerStage, *closing]
        needed = {name for cls in every for name in cls.needs}
        self.resources = build_resources(self.config, self.prompts, needed,
                                         {"llm": llm, "embedder": embedder, **(given or {})})
        # a service that did not answer (no KG server): the stages that need it leave, so no call goes to it
        missing = frozenset(name for name in needed if RESOURCES[name][1].drops and self.resources[name] is None)
        if missing:
            classes = pipeline_stages(self.config, missing=missing)
        self.pipeline: list[Stage] = [cls() for cls in classes]
        self.answer_stage = AnswerStage([STAGES.get(name) for name in self.config.strategy_names()])
        self.closing: list[Stage] = [cls() for cls in closing]
        for stage in [*self.pipeline, *self.closing]:
            stage.setup(self.config, {name: self.resources.get(name) for name in stage.needs})
        logger.info("strategy {}: {}", self.config.strategy, " -> ".join(s.name for s in self.pipeline))

    def resource(self, name: str) -> Any:
        """A resource by name, for tools and tests: None when no chosen stage needs it, or the config leaves it
        out."""
        return self.resources.get(name)

    def close(self) -> None:
        """Stop the page workers and an in-process engine (both also stop when the process exits)."""
        close_resources(self.resources)

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
        for stage in [self.answer_stage, *self.closing]:
            run_stage(stage, states, shared, always=True)
        for state in states:
            if state.done_reason:
                logger.info("{} answered '{}': {}", state.interaction_id, state.answer, state.done_reason)
        return BatchResult([state.answer or IDK for state in states], [state.record() for state in states])


def close_resources(resources: Mapping[str, Any]) -> None:
    """Stop the page workers and an in-process engine among `resources` (by name)."""
    if (pages := resources.get("pages")) is not None:
        pages.close()
    if isinstance(llm := resources.get("llm"), Closable):
        llm.close()


# A query is cut here as a page's HTML is cut at its max_page_chars: CRAG's questions are a sentence or two,
# and a longer one would take the prompt's room from the references.
MAX_QUERY_CHARS = 2000


def unpack_batch(batch: Any) -> list[QueryState]:
    """One state per position; malformed entries are finished as IDK with the reason, never raised. Queries are
    cleaned as page text is (utils/html.py clean_text) and cut at MAX_QUERY_CHARS; an integer interaction_id is read
    as its digits."""
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
        interaction_id = id_text(item["interaction_id"]) or f"#{index}"
        pages = item["search_results"] if isinstance(item["search_results"], list) else []
        query = clean_text(item["query"]) if isinstance(item["query"], str) else ""
        if len(query) > MAX_QUERY_CHARS:
            logger.warning("{}: query of {} characters cut to its first {}", interaction_id, len(query),
                           MAX_QUERY_CHARS)
            query = query[:MAX_QUERY_CHARS]
        state = QueryState(index, interaction_id, query,
                           clean_text(item["query_time"]) if isinstance(item["query_time"], str) else "",
                           [page for page in pages if isinstance(page, Mapping)])
        if not state.query.strip():
            state.finish(IDK, "query missing or empty")
        elif not isinstance(item["search_results"], list):
            logger.warning("{}: search_results is not a list; answering without pages", interaction_id)
        states.append(state)
    return states
