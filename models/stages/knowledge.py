"""knowledge: the LLM answers from its own knowledge, without references (the seed's section 4.3).

The answer (or "invalid question" when it sees a false premise) reaches the reasoning prompt as "an answer
from another agent"; an output without an answer leaves nothing.
"""

from __future__ import annotations

from models.config import SystemConfig
from models.estimates import CHARS_PER_TOKEN, StagePlan, template_tokens
from models.prompting import PromptLibrary
from models.stages.reasoning import END, parse_whole
from models.stages.stage import STAGES, Stage, StageContext
from models.state import Evidence, QueryState, Signal, StateField
from utils.answers import INVALID, is_idk, normalize_text

KNOWLEDGE = StateField[str | None](
    "knowledge", lambda: None, record=lambda value: value,
    # a model's answer without references: shown only where a prompt names it, never listed as evidence
    evidence=Evidence("Answer from another agent (without references)", "answer",
                      lines=lambda value: [value] if value else [], listed=False),
    doc='the knowledge extractor\'s answer ("an answer from another agent"), None where it gave none')


@STAGES.register("knowledge")
class KnowledgeStage(Stage):
    prompts = ("knowledge",)
    sections = ("knowledge",)
    fields = (KNOWLEDGE,)
    writes = frozenset({"knowledge"})
    needs = frozenset({"llm"})
    signals = {"knowledge.agrees": "whether the knowledge extractor's answer equals the answer (None without one)"}
    switch_on = ("knowledge.enabled=true",)

    @classmethod
    def estimate(cls, config: SystemConfig, prompts: PromptLibrary) -> list[StagePlan]:
        return [StagePlan("knowledge", template_tokens(prompts, "knowledge"), config.knowledge.max_tokens, 1)]

    @classmethod
    def evidence_chars(cls, config: SystemConfig) -> int:
        return config.knowledge.max_tokens * CHARS_PER_TOKEN  # its reply, shown whole

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        return config.knowledge.enabled

    @classmethod
    def outcome(cls, state: QueryState) -> dict[str, Signal]:
        knowledge = state[KNOWLEDGE]
        return {"knowledge.agrees": None if knowledge is None or is_idk(knowledge)
                else normalize_text(knowledge) == normalize_text(state.answer or "")}

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        prompt = ctx.prompt("knowledge")
        settings = ctx.settings
        conversations = [prompt.render(query=s.query, query_time=s.query_time) for s in states]
        outputs = ctx.generate(conversations, owners=states, max_tokens=settings.max_tokens,
                               temperature=settings.temperature, stop=[END])
        for state, samples in zip(states, outputs):
            parsed = parse_whole(samples[0]) if samples else None
            if parsed is not None:
                state[KNOWLEDGE] = INVALID if parsed.false_premise else parsed.answer
