"""multihop: the seed strategy's hand-off to a multi-hop method (`multihop: hanrag` or `dualrag`).

HANRAG's router reads every query; the ones it calls compound or complex are answered by the chosen method,
and the others go on through the strategy's next stages.
"""

from __future__ import annotations

from typing import Any

from models.config import SystemConfig
from models.retrieval.local import POOL_MAY_READ, POOL_READS
from models.stages.dualrag import DualRAGStage
from models.stages.hanrag import MULTI_HOP, ROUTE, ROUTE_SIGNAL, HANRAGStage, route, route_signal
from models.stages.stage import STAGES, Stage, StageContext
from models.state import QueryState, Signal


@STAGES.register("multihop")
class MultiHopHandoff(Stage):
    prompts = tuple(dict.fromkeys((*HANRAGStage.prompts, *DualRAGStage.prompts)))
    sections = ("hanrag", "dualrag", "reasoning")
    reads = POOL_READS
    may_read = POOL_MAY_READ
    writes = frozenset({"route", "sub_queries", "steps", "answer"})
    needs = frozenset({"llm", "embedder"})
    signals = ROUTE_SIGNAL
    switch_on = ("multihop=hanrag",)

    @classmethod
    def outcome(cls, state: QueryState) -> dict[str, Signal]:
        return route_signal(state)

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        return config.multihop != "none"

    def setup(self, config: SystemConfig, resources: dict[str, Any]) -> None:
        self.target = HANRAGStage() if config.multihop == "hanrag" else DualRAGStage()

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        route(states, ctx)
        chosen = [s for s in states if s[ROUTE] in MULTI_HOP]
        if chosen:
            self.target.answer(chosen, ctx)
