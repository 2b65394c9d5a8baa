"""knowledge: the LLM answers from its own knowledge, without references (the seed's section 4.3).

The answer (or "invalid question" when it sees a false premise) reaches the reasoning prompt as "an answer
from another agent"; an output without an answer leaves nothing.
"""

from __future__ import annotations

from models.llm.base import GenParams
from models.stages.base import StageContext
from models.stages.reasoning import END, parse_whole
from models.state import QueryState
from utils.answers import INVALID


class KnowledgeStage:
    name = "knowledge"
    prompt_names = ("knowledge",)

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        prompt = ctx.prompts.get("knowledge")
        settings = ctx.config.knowledge
        conversations = [prompt.render(query=s.query, query_time=s.query_time) for s in states]
        params = GenParams(max_tokens=settings.max_tokens, temperature=settings.temperature, n=1, stop=[END],
                           deadline=ctx.work_deadline(self.name))
        for state, samples in zip(states, ctx.llm.generate(conversations, params)):
            parsed = parse_whole(samples[0]) if samples else None
            if parsed is not None:
                state.knowledge = INVALID if parsed.false_premise else parsed.answer
