"""Stage protocol, the context stages share, and the runner that times, budgets and isolates them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from loguru import logger

from models.budget import Deadline
from models.config import SystemConfig
from models.llm.base import LLM
from models.prompting import PromptLibrary
from models.retrieval.embedder import Embedder
from models.retrieval.hash_index import HashModel
from models.retrieval.r2former import R2FormerHead
from models.retrieval.reranker import Reranker
from models.state import QueryState, StageRecord
from utils.answers import IDK
from utils.kg_api import KGClient
from utils.pages import PageProcessor


@dataclass
class StageContext:
    config: SystemConfig
    llm: LLM
    embedder: Embedder
    prompts: PromptLibrary
    deadline: Deadline
    pages: PageProcessor
    reranker: Reranker | None = None
    r2former: R2FormerHead | None = None
    kg: KGClient | None = None
    hash_model: HashModel | None = None

    def work_deadline(self, stage: str | None = None) -> Deadline:
        """When a stage's work (an LLM call, page processing) must end: the batch deadline less the answer
        reserve, and no later than the stage's `budget.stage_share` of the batch's seconds from now."""
        deadline = self.deadline.reserve(self.config.budget.answer_reserve_s)
        share = self.config.budget.stage_share.get(stage or "")
        return deadline.capped(share * self.deadline.total) if share else deadline


class Stage(Protocol):
    name: str
    prompt_names: tuple[str, ...]

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        """Read and write fields of the (not yet done) states."""


def run_stage(stage: Stage, states: list[QueryState], ctx: StageContext, always: bool = False) -> None:
    """Run `stage` on the queries still open, if the deadline affords it; a crash answers them IDK.

    `always` runs it on every query whatever the deadline (the answer step).
    """
    active = list(states) if always else [s for s in states if not s.done]
    if not active:
        return
    needed = ctx.config.budget.stage_min_s.get(stage.name, 0.0) + ctx.config.budget.answer_reserve_s
    if not always and not ctx.deadline.can_afford(needed):
        note = f"{ctx.deadline.remaining():.2f} s left, needs {needed:.2f} s"
        logger.warning("stage {} skipped for {} queries: {}", stage.name, len(active), note)
        for state in active:
            state.trace.append(StageRecord(stage.name, "skipped", 0.0, note))
        return
    started = time.perf_counter()
    status, note = "ok", ""
    try:
        stage.run(active, ctx)
    except Exception as err:  # one stage's bug must not cost the batch its answers
        status, note = "failed", f"{type(err).__name__}: {err}"
        logger.opt(exception=err).error("stage {} failed for {}: {}", stage.name,
                                         [s.interaction_id for s in active], note)
        for state in active:
            if not state.done:
                state.finish(IDK, f"{stage.name} failed")
    elapsed = time.perf_counter() - started
    for state in active:
        state.trace.append(StageRecord(stage.name, status, elapsed, note))
