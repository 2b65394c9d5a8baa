"""precheck: the dynamic pre-check (the seed's section 4.7): a query predicted to change fast answers "i don't know"
before the page and LLM stages, unless the KG brought something."""

from __future__ import annotations

from models.config import SystemConfig
from models.stages.stage import STAGES, Stage, StageContext
from models.state import QueryState
from utils.answers import IDK


@STAGES.register("precheck")
class DynamicPrecheck(Stage):
    """Queries predicted dynamic, for which the KG brought nothing, answer "i don't know" and skip the page
    processing and the LLM stages (`answer.dynamic_idk`, with an attributes method)."""

    sections = ("attributes",)
    reads = frozenset({"dynamism"})
    writes = frozenset({"answer"})

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        return config.answer.dynamic_idk and config.attributes.method != "none"

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        dynamic = set(ctx.settings.dynamic_classes)
        for state in states:
            if state.dynamism in dynamic and not state.kg_results:
                state.finish(IDK, f"predicted {state.dynamism}: answers that change this fast are not attempted "
                                  "without a KG result")
