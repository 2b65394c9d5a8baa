"""Budget planner: expected seconds per stage and per query for a config, and whether a batch fits the budget.

The model of time, per LLM stage and batch of B queries (vLLM and hf both batch the queries of a stage):
    seconds = B x prompt tokens / prefill tokens per second + generated tokens x seconds per decode step
where a decode step advances every sequence of the batch by one token, so its time barely grows with B until
the GPUs are full (an assumption: measure at the batch size you plan to use). Generated tokens are each stage's
`max_tokens` (a stage may stop earlier: the plan is an upper bound). Prompt tokens are estimated at 4
characters a token from what the prompt renders for every query and the reference budgets of the config, by each stage
(`Stage.estimate`, models/estimates.py). Page processing and embedding are `pages_s` per query, measured on real
pages.

The command line is tools/budget_plan.py; tools/check_submission.py prints the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from models.config import SystemConfig
from models.estimates import Speed, StagePlan
from models.llm.profile import load_profile
from models.loading import pipeline_stages
from models.prompting import PromptLibrary
from utils.batch import MAX_BATCH_SIZE

__all__ = ["Plan", "Speed", "StagePlan", "format_plan", "largest_fitting_batch", "llm_stages", "plan"]


def llm_stages(config: SystemConfig, prompts: PromptLibrary | None = None) -> list[StagePlan]:
    """The LLM calls a query can make under `config`, in the order of its strategy's stages (models/stages,
    `strategies` in the config), as each stage estimates them (`Stage.estimate`). Stages that make no LLM call, and
    the multi-step ones whose number of calls depends on the question (hanrag, dualrag, multihop), add nothing. A
    prompt counts at most the model profile's prompt_tokens: every backend cuts a longer one to that."""
    prompts = prompts or PromptLibrary(config.prompts)
    limit = load_profile(config.llm.profile).prompt_tokens
    return [replace(plan, prompt_tokens=min(plan.prompt_tokens, limit))
            for stage in pipeline_stages(config) for plan in stage.estimate(config, prompts)]


@dataclass(frozen=True)
class Plan:
    batch: int
    rows: list[tuple[str, float]]  # (stage, seconds for the batch)
    total_s: float
    limit_s: float

    @property
    def fits(self) -> bool:
        return self.total_s <= self.limit_s

    @property
    def per_query_s(self) -> float:
        return self.total_s / self.batch


def plan(config: SystemConfig, speed: Speed, batch: int, stages: list[StagePlan] | None = None) -> Plan:
    """Seconds per stage for a batch, against the grader's batch x per-query seconds less the safety margin."""
    stages = stages if stages is not None else llm_stages(config)
    rows = [("pages+embedding", batch * speed.pages_s)] + [(s.stage, s.seconds(batch, speed)) for s in stages]
    total = sum(seconds for _, seconds in rows)
    return Plan(batch, rows, total, batch * config.budget.per_query_s - config.budget.safety_margin_s)


def largest_fitting_batch(config: SystemConfig, speed: Speed) -> int | None:
    stages = llm_stages(config)
    fitting = [b for b in range(1, MAX_BATCH_SIZE + 1) if plan(config, speed, b, stages).fits]
    return max(fitting) if fitting else None


def format_plan(config: SystemConfig, speed: Speed, batch: int) -> str:
    stages = llm_stages(config)
    result = plan(config, speed, batch, stages)
    lines = [f"budget plan: batch {batch}, prefill {speed.prefill_tps:.0f} tok/s, decode step "
             f"{speed.step_s * 1000:.1f} ms, pages {speed.pages_s:.2f} s/query",
             f"{'stage':<16}{'prompt tok/q':>13}{'gen tok':>9}{'seqs/q':>8}{'s/batch':>10}{'s/query':>10}"]
    by_name = {s.stage: s for s in stages}
    for name, seconds in result.rows:
        s = by_name.get(name)
        cells = (f"{s.prompt_tokens:>13}{s.generated_tokens:>9}{s.sequences:>8}" if s else f"{'':>13}{'':>9}{'':>8}")
        lines.append(f"{name:<16}{cells}{seconds:>10.2f}{seconds / batch:>10.2f}")
    lines.append(f"{'total':<16}{'':>30}{result.total_s:>10.2f}{result.per_query_s:>10.2f}")
    verdict = "fits" if result.fits else "DOES NOT FIT"
    best = largest_fitting_batch(config, speed)
    lines.append(f"limit {result.limit_s:.1f} s for the batch ({config.budget.per_query_s:g} s x {batch} - "
                 f"{config.budget.safety_margin_s:g} s margin): {verdict}; largest batch that fits: {best or 'none'}")
    return "\n".join(lines)
