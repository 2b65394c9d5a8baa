"""Budget planner: expected seconds per stage and per query for a config, and whether a batch fits the budget.

The model of time, per LLM stage and batch of B queries (vLLM and hf both batch the queries of a stage):
    seconds = B x prompt tokens / prefill tokens per second + generated tokens x seconds per decode step
where a decode step advances every sequence of the batch by one token, so its time barely grows with B until
the GPUs are full (an assumption: measure at the batch size you plan to use). Generated tokens are each stage's
`max_tokens` (a stage may stop earlier: the plan is an upper bound). Prompt tokens are estimated at 4
characters a token from the prompt file and the reference budgets of the config. Page processing and embedding
are `pages_s` per query, measured on real pages.

The command line is tools/budget_plan.py; tools/check_submission.py prints the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.config import MAX_BATCH_SIZE, SystemConfig
from models.prompting import PromptLibrary
from models.stages import pipeline_stages

CHARS_PER_TOKEN = 4
QUERY_TOKENS = 40  # the question, its time and the section headers


@dataclass(frozen=True)
class Speed:
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


def _tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


def llm_stages(config: SystemConfig, prompts: PromptLibrary | None = None) -> list[StagePlan]:
    """The LLM calls a query can make under `config`, in the order of its strategy's stages (models/stages,
    `strategies` in the config); the summariser is counted as the worst case of reasoning. Stages that make no
    LLM call, and the multi-step ones whose number of calls depends on the question (hanrag, dualrag, multihop),
    add nothing."""
    prompts = prompts or PromptLibrary(config.prompts)

    def template(name: str) -> int:
        return _tokens(len(prompts.get(name).path.read_text(encoding="utf-8"))) + QUERY_TOKENS

    kg_chars = config.kg.max_chars if config.task > 1 else 0

    def attributes() -> list[StagePlan]:
        if config.attributes.method != "icl":
            return []
        icl = config.attributes.icl
        demonstrations = icl.shots_per_class * 9 * 20  # 9 classes, about 20 tokens a demonstration
        return [StagePlan("attributes", template("attributes") + demonstrations, icl.max_tokens, icl.n)]

    def kg() -> list[StagePlan]:
        name = "kg_functions" if config.kg.method == "functions" else "kg_entities"
        extra = 38 * 25 if config.kg.method == "functions" else 0  # the endpoint list
        return [StagePlan("kg", template(name) + extra, config.kg.max_tokens, 1)]

    def calculator() -> list[StagePlan]:
        calc = config.calculator
        return [StagePlan("calculator", template("calculator") + _tokens(calc.max_reference_chars + kg_chars),
                          calc.max_tokens, calc.n)]

    def reasoning() -> list[StagePlan]:
        settings = config.reasoning
        evidence = settings.max_reference_chars + config.references.table_budget_chars + kg_chars
        return [StagePlan("reasoning", template("reasoning") + _tokens(evidence), settings.max_tokens, 1),
                StagePlan("summariser", template("summariser") + _tokens(settings.max_reference_chars),
                          settings.summariser_max_tokens, 1)]

    def knowledge() -> list[StagePlan]:
        return [StagePlan("knowledge", template("knowledge"), config.knowledge.max_tokens, 1)]

    estimators = {"attributes": attributes, "kg": kg, "knowledge": knowledge, "calculator": calculator,
                  "reasoning": reasoning}
    return [plan for stage in pipeline_stages(config) for plan in estimators.get(stage.name, list)()]


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
