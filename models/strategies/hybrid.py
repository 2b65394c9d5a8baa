"""The seed system (default): attributes -> dynamic pre-check -> references -> (R2AG) -> (KG, tasks 2 and 3)
-> knowledge -> calculator -> reasoning. The answer step runs after the strategy, in CragSystem.

Attributes run before references (the design lists them after): a query that the pre-check answers
"i don't know" then costs no page processing and no embedding.
"""

from __future__ import annotations

from typing import Any

from models.config import SystemConfig
from models.stages.answer import DynamicPrecheck
from models.stages.attributes import AttributesStage
from models.stages.base import Stage, StageContext, run_stage
from models.stages.calculator import CalculatorStage
from models.stages.kg import KGStage
from models.stages.knowledge import KnowledgeStage
from models.stages.r2ag import R2AGStage
from models.stages.reasoning import ReasoningStage
from models.stages.references import ReferencesStage
from models.state import QueryState


class HybridStrategy:
    def __init__(self, config: SystemConfig, embedder: Any) -> None:
        self.stages: list[Stage] = []
        if config.attributes.method != "none":
            self.stages.append(AttributesStage(config.attributes, embedder))
            if config.answer.dynamic_idk:
                self.stages.append(DynamicPrecheck())
        self.stages.append(ReferencesStage())
        if config.r2ag.enabled:
            self.stages.append(R2AGStage())
        if config.task > 1:
            self.stages.append(KGStage())
        if config.knowledge.enabled:
            self.stages.append(KnowledgeStage())
        if config.calculator.enabled:
            self.stages.append(CalculatorStage())
        self.stages.append(ReasoningStage())

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        for stage in self.stages:
            run_stage(stage, states, ctx)
