"""Corner cases (the seed's section 4.7): the dynamic pre-check, and the answer step every query leaves by."""

from __future__ import annotations

from models.stages.base import StageContext
from models.state import QueryState
from utils.answers import IDK, final_answer


class DynamicPrecheck:
    """Queries predicted dynamic answer "i don't know" and skip the LLM stages (`answer.dynamic_idk`)."""

    name = "precheck"
    prompt_names: tuple[str, ...] = ()

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        dynamic = set(ctx.config.attributes.dynamic_classes)
        for state in states:
            if state.dynamism in dynamic:
                state.finish(IDK, f"predicted {state.dynamism}: answers that change this fast are not attempted")


class AnswerStage:
    """Canonical "i don't know" / "invalid question", one line, trimmed to 75 tokens of the LLM's tokenizer."""

    name = "answer"
    prompt_names: tuple[str, ...] = ()

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        tokenizer = getattr(ctx.llm, "tokenizer", None)
        for state in states:
            if state.answer is None and not state.done_reason:
                skipped = [r.stage for r in state.trace if r.status == "skipped"]
                state.done_reason = f"no answer (skipped: {', '.join(skipped) or 'none'})"
            state.answer = final_answer(state.answer, tokenizer)
            state.done = True
