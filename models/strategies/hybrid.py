"""The seed system's order of stages. Later issues add attributes, kg, knowledge and calculator."""

from __future__ import annotations

from models.stages.base import Stage, StageContext, run_stage
from models.stages.reasoning import ReasoningStage
from models.stages.references import ReferencesStage
from models.state import QueryState


class HybridStrategy:
    def __init__(self) -> None:
        self.stages: list[Stage] = [ReferencesStage(), ReasoningStage()]

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        for stage in self.stages:
            run_stage(stage, states, ctx)
