"""reasoning: one prompt with the references; the answer is read from ===START=== ... ===END===."""

from __future__ import annotations

import re
from dataclasses import asdict

from models.llm.base import GenParams
from models.stages.base import StageContext
from models.state import QueryState, Reference
from utils.answers import IDK

START, END = "===START===", "===END==="
_ANSWER_LINE = re.compile(r"^\s*(?:final\s+)?answer\s*:\s*(.+)", re.IGNORECASE | re.MULTILINE)


def parse_answer(output: str) -> str:
    """The text between the markers; failing that an "Answer:" line; failing that the first line."""
    if START in output:
        return output.split(START, 1)[1].split(END, 1)[0].strip()
    match = _ANSWER_LINE.search(output)
    if match:
        return match.group(1).strip()
    return next((line.strip() for line in output.splitlines() if line.strip()), "")


def fit_references(references: list[Reference], max_chars: int) -> list[Reference]:
    """The best-ranked references whose texts fit in max_chars together (the best one always)."""
    kept: list[Reference] = []
    used = 0
    for ref in references:
        if kept and used + len(ref.text) > max_chars:
            break
        kept.append(ref)
        used += len(ref.text)
    return kept


class ReasoningStage:
    name = "reasoning"
    prompt_names = ("reasoning",)

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        prompt = ctx.prompts.get("reasoning")
        settings = ctx.config.reasoning
        conversations = [prompt.render(query=s.query, query_time=s.query_time,
                                       references=[asdict(r) for r in fit_references(s.references,
                                                                                     settings.max_reference_chars)])
                         for s in states]
        params = GenParams(max_tokens=settings.max_tokens, temperature=settings.temperature, n=1, stop=[END],
                           deadline=ctx.deadline.reserve(ctx.config.budget.answer_reserve_s))
        for state, samples in zip(states, ctx.llm.generate(conversations, params)):
            if not samples or not samples[0].strip():
                state.finish(IDK, "reasoning: the LLM returned nothing")
                continue
            state.llm_output = samples[0]
            state.answer = parse_answer(samples[0])
