"""The answer gate in the pipeline (`answer.gate`): after the answer step, an answer whose P(correct | its
signals) is under the gate's threshold becomes "i don't know"; the record keeps P, the threshold and the withheld
answer, and the run's judge judges the withheld answer too."""

from __future__ import annotations

from typing import Any

from loguru import logger

from models.config import SystemConfig
from models.gate.answer_gate import Gate, GateSettings, gate_for, gate_settings
from models.prompting import PromptLibrary
from models.resources import Resource
from models.stages.stage import STAGES, Stage, StageContext
from models.state import QueryState, StateField
from utils.answers import IDK, is_idk


def build_gate(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> Gate:
    return gate_for(config, prompts)


GATE = StateField[dict[str, Any] | None](
    "gate", lambda: None, record=lambda value: value, record_none=False,
    doc="P(correct), the threshold, and the answer the gate withheld, if it did")


@STAGES.register("gate")
class GateStage(Stage):
    """CragSystem runs it after the answer step, on every query, when `answer.gate` names a file; a strategy does
    not list it."""

    section_keys = {"answer": GateSettings}
    fields = (GATE,)
    # Built before the models: a gate the config cannot feed stops the start before anything loads.
    resources = {"gate": Resource(build_gate, doc="the answer gate of `answer.gate`", first=True)}
    writes = frozenset({"answer", "gate"})
    needs = frozenset({"gate"})
    closing = True

    def __init__(self) -> None:
        self._unfed: set[str] = set()  # signals said once to be missing where the fit always had them

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        return bool(gate_settings(config).gate)

    def setup(self, config: SystemConfig, resources: dict[str, Any]) -> None:
        logger.info("answer gate {}: an answer with P(correct) under {:.3f} becomes \"i don't know\"",
                    gate_settings(config).gate, resources["gate"].threshold)

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        gate: Gate = ctx.resource("gate")
        for state in states:
            if state.answer is None or is_idk(state.answer):
                continue
            self._say_unfed(gate, state)
            p = gate.p_correct(state.signals)
            decision: dict[str, Any] = {"p_correct": round(p, 4), "threshold": round(gate.threshold, 4)}
            state[GATE] = decision
            if p < gate.threshold:
                decision["withheld"] = state.answer
                reason = f"gate: p(correct) {p:.2f} < {gate.threshold:.2f}"
                state.answer = IDK
                state.done_reason = f"{state.done_reason}; {reason}" if state.done_reason else reason

    def _say_unfed(self, gate: Gate, state: QueryState) -> None:
        """Log, once per signal, one the fit always had that this answer lacks (a backend that gives no
        log-probabilities, a route without them): it is read as missing, which the fit never saw."""
        for name in gate.always_present():
            if name not in self._unfed and state.signals.get(name) is None:
                self._unfed.add(name)
                logger.warning("answer gate: signal {} is missing for {} although every answer the gate was fit on "
                               "had it; it is read as missing (at the fit's mean)", name, state.interaction_id)
