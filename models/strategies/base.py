"""What every strategy shares: stages run in order through run_stage, and the stages that gather evidence."""

from __future__ import annotations

from typing import Any

from models.config import SystemConfig
from models.stages.answer import DynamicPrecheck
from models.stages.attributes import AttributesStage
from models.stages.base import Stage, StageContext, run_stage
from models.stages.kg import KGStage
from models.stages.r2ag import R2AGStage
from models.stages.references import ReferencesStage
from models.state import QueryState


def retrieval_stages(config: SystemConfig, embedder: Any) -> list[Stage]:
    """attributes -> dynamic pre-check -> references -> (R2AG) -> (KG, tasks 2 and 3), as the config asks.

    Attributes run before references (the design lists them after): a query that the pre-check answers
    "i don't know" then costs no page processing and no embedding.
    """
    stages: list[Stage] = []
    if config.attributes.method != "none":
        stages.append(AttributesStage(config.attributes, embedder))
        if config.answer.dynamic_idk:
            stages.append(DynamicPrecheck())
    stages.append(ReferencesStage())
    if config.r2ag.enabled:
        stages.append(R2AGStage())
    if config.task > 1:
        stages.append(KGStage())
    return stages


class StagedStrategy:
    """Runs its stages in order on the queries still open; the answer step runs after it, in CragSystem."""

    stages: list[Stage]

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        for stage in self.stages:
            run_stage(stage, states, ctx)
