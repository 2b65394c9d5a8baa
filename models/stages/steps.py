"""What the multi-step stages (HANRAG, DualRAG) share: one counted LLM step, and the answer from its output."""

from __future__ import annotations

from models.llm.backend import Sample, cut_short
from models.prompting import Messages
from models.stages.reasoning import parse_structured
from models.stages.stage import StageContext
from models.state import QueryState
from utils.answers import IDK, INVALID

# What a conversation without a reply reads as: no text, which no parser finds an answer in.
NO_REPLY = Sample("")


def step(ctx: StageContext, conversations: list[Messages], max_tokens: int, states: list[QueryState],
         owners: list[QueryState] | None = None) -> list[Sample]:
    """One greedy backend call, one LLM step for each distinct state; each conversation's reply (NO_REPLY when
    none). `owners` names the query of each conversation where `states` is not that list (one state per
    conversation)."""
    outputs = ctx.generate(conversations, owners=states if owners is None else owners, max_tokens=max_tokens,
                           states=states)
    return [samples[0] if samples else NO_REPLY for samples in outputs]


def finish(state: QueryState, output: Sample, how: str) -> None:
    """Fix the answer from a seed-format output; no answer in it is "i don't know"."""
    parsed = parse_structured(output.text)
    if parsed is not None and (reason := cut_short(output, parsed.answer)):
        state.finish(IDK, f"{how}: generation cut short ({reason})")
    elif parsed is None:
        state.finish(IDK, f"{how}: no answer in the output")
    else:
        state.finish(INVALID if parsed.false_premise else parsed.answer, f"{how}, {state.steps} steps")
