"""calculator: the LLM writes Python arithmetic from the references, utils/safe_eval computes it (section 4.4).

`n` samples per query; every line that safe_eval accepts becomes "expression = value"; results are
deduplicated by expression and by value, and at most `max_results` reach the reasoning prompt.
"""

from __future__ import annotations

import re

from loguru import logger

from models.config import SystemConfig
from models.estimates import StagePlan, template_tokens, tokens
from models.kg.settings import KGSettings
from models.prompting import PromptLibrary, render_with_evidence
from models.stages.reasoning import prompt_evidence
from models.stages.stage import STAGES, Stage, StageContext
from models.state import EVIDENCE, Evidence, QueryState, StateField
from utils.safe_eval import SafeEvalError, Value, safe_eval

_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*\s*=(?!=)\s*")


def candidate_expressions(output: str) -> list[tuple[str, str]]:
    """(expression, comment) pairs: the lines of the code blocks (all lines when there are none).

    A trailing "# comment" becomes the comment; "name = expr" keeps expr and uses the name as the comment.
    """
    blocks = _CODE_BLOCK.findall(output)
    lines = [line for block in blocks for line in block.splitlines()] if blocks else output.splitlines()
    found = []
    for line in lines:
        code, _, comment = line.partition("#")
        code, comment = code.strip().rstrip(","), comment.strip()
        assigned = _ASSIGNMENT.match(code)
        if assigned:
            comment = comment or code[:assigned.end()].rstrip(" =")
            code = code[assigned.end():]
        if code and any(ch.isdigit() for ch in code):
            found.append((code, comment))
    return found


def format_value(value: Value) -> str:
    """Numbers as a reader writes them: floats to 10 significant digits ("126", "0.3333333333")."""
    if isinstance(value, float):
        return f"{value:.10g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def calculations(samples: list[str], max_results: int) -> list[str]:
    """Distinct "expression = value  (comment)" lines over all samples, in order of first appearance."""
    results: list[str] = []
    seen_expressions: set[str] = set()
    seen_values: set[str] = set()
    refused = 0
    for sample in samples:
        for expression, comment in candidate_expressions(sample):
            key = expression.replace(" ", "")
            if key in seen_expressions:
                continue
            seen_expressions.add(key)
            try:
                value = format_value(safe_eval(expression))
            except SafeEvalError:
                refused += 1
                continue
            if value in seen_values:
                continue
            seen_values.add(value)
            results.append(f"{expression} = {value}" + (f"  ({comment})" if comment else ""))
            if len(results) == max_results:
                return results
    if refused:
        logger.debug("calculator: {} expressions refused by safe_eval", refused)
    return results


CALCULATION_CHARS = 80  # an "expression = value  (comment)" line, at most about this long: an assumption
CALCULATIONS = StateField[list[str]](
    "calculations", list, record=list, evidence=Evidence("Calculation results", "calculation"),
    doc='"expression = value" of each calculation, from the calculator')


@STAGES.register("calculator")
class CalculatorStage(Stage):
    prompts = ("calculator",)
    sections = ("calculator",)
    fields = (CALCULATIONS,)
    reads = frozenset({"references"})
    may_read = frozenset({EVIDENCE})
    writes = frozenset({"calculations"})
    needs = frozenset({"llm"})
    switch_on = ("calculator.enabled=true",)

    @classmethod
    def estimate(cls, config: SystemConfig, prompts: PromptLibrary) -> list[StagePlan]:
        calc = config.calculator
        kg_chars = config.section("kg", KGSettings).max_chars if config.task > 1 else 0
        return [StagePlan("calculator", template_tokens(prompts, "calculator")
                          + tokens(calc.max_reference_chars + kg_chars), calc.max_tokens, calc.n)]

    @classmethod
    def evidence_chars(cls, config: SystemConfig) -> int:
        return config.calculator.max_results * CALCULATION_CHARS

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        return config.calculator.enabled

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        prompt = ctx.prompt("calculator")
        settings = ctx.settings
        conversations = []
        for s in states:
            texts, tables = prompt_evidence(s, settings.max_reference_chars)
            conversations.append(render_with_evidence(prompt, s, query=s.query, query_time=s.query_time,
                                                      references=texts, tables=tables))
        outputs = ctx.generate(conversations, owners=states, max_tokens=settings.max_tokens,
                               temperature=settings.temperature, n=settings.n)
        for state, samples in zip(states, outputs):
            state[CALCULATIONS] = calculations([sample.text for sample in samples], settings.max_results)
