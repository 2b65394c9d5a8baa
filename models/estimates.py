"""What a stage tells the budget planner (models/budget_planner.py): the LLM calls one query makes in it, each as a
StagePlan, with prompt tokens estimated from the prompt's fixed text and the config's character budgets.

A stage declares them in `Stage.estimate`; the planner adds them up in the strategy's order.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.prompting import PromptLibrary

CHARS_PER_TOKEN = 4
QUERY_TOKENS = 40  # the question and its time


@dataclass(frozen=True)
class Speed:
    """What the planner assumes of the machine (tools/budget_plan.py measures or takes it)."""

    prefill_tps: float  # prompt tokens per second, over the whole batch
    step_s: float       # seconds per decode step of a batch
    pages_s: float      # page processing and embedding, per query


@dataclass(frozen=True)
class StagePlan:
    stage: str
    prompt_tokens: int      # per query
    generated_tokens: int   # per sequence, at most
    sequences: int          # per query (samples)

    def seconds(self, batch: int, speed: Speed) -> float:
        return batch * self.prompt_tokens / speed.prefill_tps + self.generated_tokens * speed.step_s


def tokens(chars: int) -> int:
    """Tokens of `chars` characters of English text, rounded up."""
    return -(-chars // CHARS_PER_TOKEN)


def template_tokens(prompts: PromptLibrary, name: str) -> int:
    """Tokens of what prompt `name` renders for every query (its fixed text) and of the question it carries: a
    comment in the prompt file, or a template construct that renders nothing without its evidence, costs none."""
    return tokens(len(prompts.get(name).fixed_text())) + QUERY_TOKENS
