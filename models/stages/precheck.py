"""precheck: the dynamic pre-check (the seed's section 4.7): a query predicted to change fast answers "i don't know"
before the page and LLM stages, unless evidence of a source of its own (the KG's rows) came first."""

from __future__ import annotations

from dataclasses import dataclass

from models.config import SystemConfig
from models.stages.stage import STAGES, Stage, StageContext
from models.state import EVIDENCE, QueryState
from utils.answers import IDK


@dataclass
class DynamicIDKSettings:
    """What becomes "i don't know": the dynamic pre-check (models/stages/precheck.py)."""

    dynamic_idk: bool = True
    """Queries predicted dynamic (attributes.dynamic_classes) answer "i don't know" without the LLM stages."""


@STAGES.register("precheck")
class DynamicPrecheck(Stage):
    """Queries predicted dynamic, for which the KG brought nothing, answer "i don't know" and skip the page
    processing and the LLM stages (`answer.dynamic_idk`, with an attributes method)."""

    section_keys = {"answer": DynamicIDKSettings}
    sections = ("attributes",)
    reads = frozenset({"dynamism"})
    may_read = frozenset({EVIDENCE})
    writes = frozenset({"answer"})
    switch_on = ("answer.dynamic_idk=true",)

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        return config.section("answer", DynamicIDKSettings).dynamic_idk and config.attributes.method != "none"

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        dynamic = set(ctx.section("attributes").dynamic_classes)
        for state in states:
            if state.dynamism in dynamic and not state.grounded():
                state.finish(IDK, f"predicted {state.dynamism}: answers that change this fast are not attempted "
                                  "without a KG result")
