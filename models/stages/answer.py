"""answer: every query leaves with a string: canonical "i don't know" / "invalid question", 75 tokens at most."""

from __future__ import annotations

from models.stages.base import StageContext
from models.state import QueryState
from utils.answers import final_answer


class AnswerStage:
    name = "answer"
    prompt_names: tuple[str, ...] = ()

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        for state in states:
            if state.answer is None and not state.done_reason:
                skipped = [r.stage for r in state.trace if r.status == "skipped"]
                state.done_reason = f"no answer (skipped: {', '.join(skipped) or 'none'})"
            state.answer = final_answer(state.answer)
            state.done = True
