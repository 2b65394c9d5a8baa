"""Corner cases (the seed's section 4.7): the dynamic pre-check, the evidence check, and the answer step every
query leaves by."""

from __future__ import annotations

from models.config import SystemConfig
from models.stages.base import STAGES, Stage, StageContext
from models.state import QueryState
from utils.answers import IDK, final_answer


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


@STAGES.register("evidence")
class EvidenceCheck(Stage):
    """Queries with no reference from the pages and no KG result answer "i don't know": there is nothing to
    reason over, and an answer from the model's memory alone is a guess."""

    reads = frozenset({"references"})
    writes = frozenset({"answer"})

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        for state in states:
            if not state.references and not state.kg_results:
                state.finish(IDK, "no usable text in the search results and no KG result")


class AnswerStage(Stage):
    """Canonical "i don't know" / "invalid question", one line, within the grader's 75 Llama-2 tokens. CragSystem
    runs it after every strategy, on every query; it is not a name a strategy lists."""

    name = "answer"
    writes = frozenset({"answer"})

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        for state in states:
            if state.answer is None and not state.done_reason:
                skipped = [r.stage for r in state.trace if r.status == "skipped"]
                state.done_reason = f"no answer (skipped: {', '.join(skipped) or 'none'})"
            state.answer, change = final_answer(state.answer)
            if change:
                state.done_reason = f"{state.done_reason}; {change}" if state.done_reason else change
            state.done = True
