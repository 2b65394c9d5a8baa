"""The seed system (default): attributes -> references -> (R2AG) -> (KG, tasks 2 and 3) -> dynamic pre-check and
evidence check -> (multi-hop hand-off) -> knowledge -> calculator -> reasoning. The answer step runs after the
strategy, in CragSystem.

With `multihop: hanrag` or `dualrag`, HANRAG's router reads every query first; the ones it calls compound or
complex are answered by that strategy, the others go on through the seed's stages.
"""

from __future__ import annotations

from typing import Any

from models.config import SystemConfig
from models.stages.base import Stage, StageContext
from models.stages.calculator import CalculatorStage
from models.stages.knowledge import KnowledgeStage
from models.stages.reasoning import ReasoningStage
from models.state import QueryState
from models.strategies.base import StagedStrategy, retrieval_stages
from models.strategies.dualrag import DualRAGStage
from models.strategies.hanrag import MULTI_HOP, HANRAGStage, route


class MultiHopHandoff:
    """Routes the batch with HANRAG's router and answers the compound and complex queries with `target`."""

    name = "multihop"

    def __init__(self, target: HANRAGStage | DualRAGStage) -> None:
        self.target = target
        self.prompt_names = ("hanrag_router", *target.prompt_names)

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        route(states, ctx)
        chosen = [s for s in states if s.route in MULTI_HOP]
        if chosen:
            self.target.answer(chosen, ctx)


class HybridStrategy(StagedStrategy):
    def __init__(self, config: SystemConfig, embedder: Any, kg: bool = False) -> None:
        self.stages: list[Stage] = retrieval_stages(config, embedder, kg)
        if config.multihop != "none":
            self.stages.append(MultiHopHandoff(HANRAGStage() if config.multihop == "hanrag" else DualRAGStage()))
        if config.knowledge.enabled:
            self.stages.append(KnowledgeStage())
        if config.calculator.enabled:
            self.stages.append(CalculatorStage())
        self.stages.append(ReasoningStage())
