"""The answer gate: P(correct | a query's confidence signals) by a logistic model read from a JSON file, and the
threshold under which an answer is withheld ("i don't know"). Fitting is in evaluation/gate_fit.py.

A gate file holds readable numbers only (never a pickle): the columns the signals become, their scaling, the
weights, the threshold, what it was fit on and its figures. Columns: a number (a bool counts 0/1) with a column
saying it was missing; a category (a string signal) one column per value seen at fit time. A missing number takes
the fit's mean (0 once standardised) and sets its missing column, at fit time and at apply time alike.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from models.config import ConfigError, SystemConfig, resolve_path
from models.llm.weights import weights_of
from models.prompting import PromptLibrary
from models.state import Signal
from utils.errors import HarnessError
from utils.trees import differences

FORMAT = "crag-answer-gate/1"


class GateError(HarnessError, ValueError):
    """A gate file that cannot be read, or a gate the configuration cannot feed; the message says which."""


@dataclass(frozen=True)
class Column:
    """One input of the logistic model: `kind` "number" (the signal's value), "missing" (1 where the signal is
    missing) or "category" (1 where the signal equals `value`)."""

    signal: str
    kind: str
    value: str | None = None


# The prompts whose wording moves the reasoning signals (the answer line and its log-probabilities), each with the
# `reasoning` key that switches it off at 0: a prompt the setup never renders moves nothing.
SIGNAL_PROMPTS = {"reasoning": "max_tokens", "summariser": "summariser_max_tokens"}


def answering(setup: dict[str, Any]) -> dict[str, Any]:
    """`setup` (signal_setup's, or one a gate file recorded) with only the prompts its reasoning settings render:
    what two setups are compared on, so an edit to a prompt a gate's config never renders leaves the gate valid."""
    reasoning = setup.get("reasoning") or {}
    prompts = {name: digest for name, digest in (setup.get("prompts") or {}).items()
               if name not in SIGNAL_PROMPTS or reasoning.get(SIGNAL_PROMPTS[name]) != 0}
    return {**setup, "prompts": prompts}


def signal_setup(config: dict[str, Any], prompt_digests: dict[str, str],
                 weights: dict[str, str] | None = None) -> dict[str, Any]:
    """What produces the signals a gate reads, from a resolved config as plain JSON (a run manifest's
    `answers.config`), the prompts' digests and the weights' (a run manifest's `answers.weights`; None: hashed
    now, models/llm/weights.py): the LLM (backend, in-process dtype, the profile and its weights' fingerprint or
    the server's report), the reasoning settings, the reasoning prompts it renders (`answering`) and the KG stage's
    method, which makes the `kg.*` signals. A gate fit on one setup is refused by a config of another."""
    llm = config.get("llm") or {}
    backend = llm.get("backend")
    model = {"backend": backend}
    if backend in ("hf", "vllm"):  # the dtype that runs in-process (a served engine's is on its own machine)
        model["dtype"] = (llm.get(backend) or {}).get("dtype")
    model.update(weights_of(llm) if weights is None else weights)
    return answering({"llm": model, "reasoning": config.get("reasoning"),
                      "prompts": {name: prompt_digests.get(name) for name in SIGNAL_PROMPTS},
                      "kg": {"method": (config.get("kg") or {}).get("method")}})


def columns_for(examples: list[dict[str, Signal]]) -> list[Column]:
    """The columns of a set of examples' signals: a number and its missing flag per numeric signal, one column per
    category value seen; sorted by signal name so a gate reads the same on every machine."""
    numeric: set[str] = set()
    categories: dict[str, set[str]] = {}
    for signals in examples:
        for name, value in signals.items():
            if isinstance(value, str):
                categories.setdefault(name, set()).add(value)
            elif value is not None:
                numeric.add(name)
    columns = []
    for name in sorted(numeric | set(categories)):
        if name in numeric:
            columns += [Column(name, "number"), Column(name, "missing")]
        columns += [Column(name, "category", value) for value in sorted(categories.get(name, ()))]
    return columns


def raw_row(columns: list[Column], signals: dict[str, Signal]) -> list[float | None]:
    """The columns' values for one query before scaling; None for a missing number (imputed by `scaled_row`)."""
    row: list[float | None] = []
    for column in columns:
        value = signals.get(column.signal)
        if column.kind == "number":
            row.append(float(value) if isinstance(value, (int, float)) and math.isfinite(float(value)) else None)
        elif column.kind == "missing":
            row.append(0.0 if isinstance(value, (int, float)) and math.isfinite(float(value)) else 1.0)
        else:
            row.append(1.0 if value == column.value else 0.0)
    return row


def scaled_row(row: list[float | None], mean: list[float], scale: list[float]) -> list[float]:
    """Standardised values; a missing number sits at the mean (0)."""
    return [0.0 if value is None else (value - m) / s for value, m, s in zip(row, mean, scale)]


@dataclass
class Gate:
    columns: list[Column]
    mean: list[float]
    scale: list[float]
    weights: list[float]
    intercept: float
    threshold: float
    fit_on: dict[str, Any] = field(default_factory=dict)  # LLM, signal settings hash, prompts, run manifests
    figures: dict[str, Any] = field(default_factory=dict)  # what `gate fit` printed

    def p_correct(self, signals: dict[str, Signal]) -> float:
        row = scaled_row(raw_row(self.columns, signals), self.mean, self.scale)
        z = self.intercept + sum(w * x for w, x in zip(self.weights, row))
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def always_present(self) -> list[str]:
        """The numeric signals that no record of the fit lacked (their missing column's mean is 0)."""
        return [column.signal for column, mean in zip(self.columns, self.mean)
                if column.kind == "missing" and mean == 0.0]

    def signals(self) -> list[str]:
        """The signal names the gate reads."""
        return sorted({column.signal for column in self.columns})

    def save(self, path: Path) -> None:
        data = {"format": FORMAT, **asdict(self)}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path | str) -> Gate:
        """The gate in `path`; GateError naming the file and what is wrong with it. Prompts its setup recorded by
        file sha256, as older gates hold them, read as digests (docs/decisions/prompt-identity.md)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise GateError(f"{path}: not a readable gate file ({type(err).__name__}: {err}); make one with "
                            "`local_evaluation.py gate fit RUN --out FILE`") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise GateError(f"{path}: not a gate file of format {FORMAT}")
        try:
            columns = [Column(**c) for c in data["columns"]]
            gate = cls(columns, [float(x) for x in data["mean"]], [float(x) for x in data["scale"]],
                       [float(x) for x in data["weights"]], float(data["intercept"]), float(data["threshold"]),
                       dict(data.get("fit_on") or {}), dict(data.get("figures") or {}))
        except (KeyError, TypeError, ValueError) as err:
            raise GateError(f"{path}: malformed gate ({type(err).__name__}: {err})") from None
        if not len(columns) == len(gate.mean) == len(gate.scale) == len(gate.weights):
            raise GateError(f"{path}: {len(columns)} columns, {len(gate.mean)} means, {len(gate.scale)} scales and "
                            f"{len(gate.weights)} weights")
        setup = gate.fit_on.get("setup")
        if isinstance(setup, dict) and isinstance(setup.get("prompts"), dict):
            gate.fit_on["setup"] = {**setup, "prompts": PromptLibrary().upgrade(setup["prompts"])}
        return gate


@dataclass
class GateSettings:
    """And the answer gate (models/gate/gate_stage.py), after the answer step."""

    gate: str | None = None
    """An answer gate file (`local_evaluation.py gate fit`): an answer whose P(correct) is under its threshold becomes
    "i don't know"; null: no gate."""
    gate_strict: bool = True
    """Refuse at start-up a gate fit on another LLM, other reasoning settings or prompts; false: run it, warning
    with the difference."""


def gate_settings(config: SystemConfig) -> GateSettings:
    """The gate's keys of the config's `answer` section."""
    return config.section("answer", GateSettings)


def gate_for(config: SystemConfig, prompts: PromptLibrary) -> Gate:
    """The gate of `answer.gate`, checked against what produces the signals under `config` (its LLM, reasoning
    settings and prompts) before any model loads. A gate fit on another setup is a ConfigError naming the
    differences, unless `answer.gate_strict` is false (then a warning names them)."""
    settings = gate_settings(config)
    if not settings.gate:
        raise ConfigError(f"{config.source}: answer.gate names no gate file")
    path = resolve_path(settings.gate)
    try:
        gate = Gate.load(path)
    except GateError as err:
        raise ConfigError(f"{config.source}: answer.gate: {err}") from None
    fit_on = gate.fit_on.get("setup")
    resolved = json.loads(json.dumps(config.resolved()))  # as a run's manifest holds it: tuples as lists
    changed = differences(answering(fit_on), signal_setup(resolved, prompts.digests())) if fit_on else [
        "the gate file does not say what it was fit on"]
    if changed:
        said = "; ".join(changed[:6]) + (f"; and {len(changed) - 6} more" if len(changed) > 6 else "")
        if settings.gate_strict:
            raise ConfigError(f"{config.source}: answer.gate {path} was fit on another setup than this config's "
                              f"({said}): refit it on runs of this config (`local_evaluation.py gate fit`; the "
                              "shipped data/gates/cpu.json: `make gate`), or set answer.gate_strict: false to run it "
                              "anyway")
        logger.warning("answer.gate {} was fit on another setup ({}); running it anyway (answer.gate_strict: false)",
                       path, said)
    return gate
