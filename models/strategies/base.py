"""What every strategy shares: stages run in order through run_stage, the stages that gather evidence, and the
step helpers of the multi-hop strategies (a deadline check, a counted LLM call, the answer from its output)."""

from __future__ import annotations

from typing import Any

from models.config import SystemConfig
from models.llm.base import GenParams, cut_short
from models.stages.answer import DynamicPrecheck, EvidenceCheck
from models.stages.attributes import AttributesStage
from models.stages.base import Stage, StageContext, run_stage
from models.stages.kg import KGStage
from models.stages.r2ag import R2AGStage
from models.stages.reasoning import parse_structured
from models.stages.references import ReferencesStage
from models.state import QueryState
from utils.answers import IDK, INVALID


def retrieval_stages(config: SystemConfig, embedder: Any, kg: bool) -> list[Stage]:
    """attributes -> references -> (R2AG) -> (KG, when `kg`: tasks 2 and 3 with a server that answered) ->
    evidence check, with the dynamic pre-check where it can act.

    Attributes run before references (the design lists them after). Without the KG, the pre-check follows them,
    so a query it answers "i don't know" costs no page processing. With the KG it follows the KG: the KG
    answers exactly the questions that change fast (today's price, last night's game), so the pre-check only
    takes the dynamic queries the KG brought nothing for.
    """
    stages: list[Stage] = []
    precheck = config.attributes.method != "none" and config.answer.dynamic_idk
    if config.attributes.method != "none":
        stages.append(AttributesStage(config.attributes, embedder))
    if precheck and not kg:
        stages.append(DynamicPrecheck())
    stages.append(ReferencesStage())
    if config.r2ag.enabled:
        stages.append(R2AGStage())
    if kg:
        stages.append(KGStage())
        if precheck:
            stages.append(DynamicPrecheck())
    stages.append(EvidenceCheck())
    return stages


class StagedStrategy:
    """Runs its stages in order on the queries still open; the answer step runs after it, in CragSystem."""

    stages: list[Stage]

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        for stage in self.stages:
            run_stage(stage, states, ctx)


def can_step(ctx: StageContext) -> bool:
    """Whether the deadline affords one more LLM step (the reasoning stage's minimum and the answer reserve)."""
    budget = ctx.config.budget
    return ctx.deadline.can_afford(budget.stage_min_s.get("reasoning", 1.0) + budget.answer_reserve_s)


def generate(ctx: StageContext, conversations: list, max_tokens: int, states: list[QueryState]) -> list[str]:
    """One backend call; the first sample of each conversation ("" when none); a step for each distinct state."""
    if not conversations:
        return []
    params = GenParams(max_tokens=max_tokens, temperature=0.0, n=1, deadline=ctx.work_deadline("reasoning"))
    for state in {id(s): s for s in states}.values():
        state.steps += 1
    return [samples[0] if samples else "" for samples in ctx.llm.generate(conversations, params)]


def finish(state: QueryState, output: str, how: str) -> None:
    """Fix the answer from a seed-format output; no answer in it is "i don't know"."""
    parsed = parse_structured(output)
    if parsed is not None and (reason := cut_short(output, parsed.answer)):
        state.finish(IDK, f"{how}: generation cut short ({reason})")
    elif parsed is None:
        state.finish(IDK, f"{how}: no answer in the output")
    else:
        state.finish(INVALID if parsed.false_premise else parsed.answer, f"{how}, {state.steps} steps")
