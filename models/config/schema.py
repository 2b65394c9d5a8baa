"""SystemConfig: the whole system's settings, its sections (models/config/sections.py) and the sections stages
declare (`Stage.settings` and `Stage.section_keys`, registered in STAGE_SECTIONS); the dataclass defaults are the
base every config file changes. Loading is models/config/loader.py."""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, overload

from annotated_types import Interval

from models.config.sections import (
    AttributesConfig,
    BudgetConfig,
    CalculatorConfig,
    EmbedderConfig,
    KnowledgeConfig,
    LLMConfig,
    ReasoningConfig,
    ReferencesConfig,
)
from models.config.validation import NotABool, adapter
from utils.batch import MAX_BATCH_SIZE
from utils.errors import ConfigError
from utils.names import did_you_mean

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
T = TypeVar("T")

# Strategies: ordered lists of stage names (models/stages/). The stages every built-in strategy starts with
# gather the evidence; a stage whose switch is off in the config (`knowledge.enabled: false`, `r2ag.enabled:
# false`, task 1 for `kg`) is left out of the pipeline, so one list serves every setting. The KG runs before the
# pages so that the dynamic pre-check, which needs its results, spares the queries it answers "i don't know" the
# page processing.
GATHER = ["attributes", "kg", "precheck", "references", "r2ag", "evidence"]
DEFAULT_STRATEGIES = {
    "hybrid": [*GATHER, "multihop", "knowledge", "calculator", "reasoning"],  # the seed system
    "hanrag": [*GATHER, "hanrag"],
    "dualrag": [*GATHER, "dualrag"],
}


@dataclass
class SystemConfig:
    """The whole system's settings; a config file sets any of its keys (configs/cpu.yaml is the default file)."""

    batch_size: Annotated[int, Interval(ge=1, le=MAX_BATCH_SIZE)] = 4
    """Queries per batch (what get_batch_size() tells the grader)."""
    task: Annotated[Literal[1, 2, 3], NotABool()] = 1
    """CRAG task: 1 (web pages only; the KG is never called), 2 or 3 (pages and the mock KG API)."""
    strategy: str = "hybrid"
    """A name in `strategies`: hybrid (the seed system), hanrag or dualrag (docs/methods/multi-hop.md)."""
    strategies: dict[str, list[str]] = field(default_factory=lambda: copy.deepcopy(DEFAULT_STRATEGIES),
                                             metadata={"merge": True})
    """Ordered stage lists by strategy name, added to the built-in ones (a same name replaces it). A list inside a
    list is spliced in, so a YAML anchor can share a prefix: `mine: [*gather, my_stage, reasoning]`."""
    stage_modules: list[str] = field(default_factory=list)
    """Modules imported before the pipeline is built, so that the stages they register can be named in strategies."""
    multihop: Literal["none", "hanrag", "dualrag"] = "none"
    """hybrid only: the questions HANRAG's router calls compound or complex go to this method (the multihop
    stage); none: hybrid answers them like the others."""
    llm: LLMConfig = field(default_factory=LLMConfig)
    """The language model: backend, and the settings of each backend."""
    embedder: EmbedderConfig = field(default_factory=EmbedderConfig)
    """The sentence embedder of the references, the KG rows, HASH-RAG and R2AG."""
    attributes: AttributesConfig = field(default_factory=AttributesConfig)
    """Domain and dynamism prediction (the dynamic pre-check reads it)."""
    references: ReferencesConfig = field(default_factory=ReferencesConfig)
    """Web page processing and ranking: page workers and cache, chunking, tables, top-k, re-ranker, retriever."""
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    """The knowledge extractor: the LLM answers without references; its answer reaches reasoning as "another
    agent's answer"."""
    calculator: CalculatorConfig = field(default_factory=CalculatorConfig)
    """The calculator: the LLM writes arithmetic, utils/safe_eval computes it."""
    reasoning: ReasoningConfig = field(default_factory=ReasoningConfig)
    """The final answer prompt."""
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    """The batch deadline and what each stage may spend of it, in seconds."""
    prompts: dict[str, str] = field(default_factory=dict)
    """Prompt variants: `name: path/to/variant.yaml` replaces prompts/<name>.yaml (paths from the repository)."""
    record_prompts: bool = False
    """Write each query's LLM conversations and replies into its record (`prompts` in predictions.jsonl's trace).
    Off: prompts are large. It changes no answer, so the run manifest leaves it out."""
    source: str = field(default="<defaults>", metadata={"internal": True})
    """The file(s) and --set keys the config was loaded from (set by the loader, not a key)."""
    stage_settings: dict[str, list[Any]] = field(default_factory=dict, metadata={"internal": True})
    """The sections stages declare (STAGE_SECTIONS), by section name: one settings object per part, in the order
    the parts were declared (set by the loader; `section` reads them)."""

    def __post_init__(self) -> None:
        """The checks that span keys; each key's own type, choices and range are checked as it loads (a declared
        section's own checks are its dataclass's __post_init__)."""
        self.strategy_names()  # an unknown strategy fails at load
        if self.budget.per_query_s <= self.budget.safety_margin_s / max(self.batch_size, 1):
            raise ConfigError(f"{self.source}: budget.per_query_s is too small for the safety margin")

    @overload
    def section(self, name: str) -> Any: ...

    @overload
    def section(self, name: str, part: type[T]) -> T: ...

    def section(self, name: str, part: type | None = None) -> Any:
        """The settings section `name`: a SystemConfig section, or one stages declare (its defaults where the config
        does not set it). `part`: the keys one feature declares in a section others declare keys of too (`answer`,
        or `references.hash` beside the SystemConfig section), as that feature's dataclass; such a section is read
        by part (a SystemConfig section without `part` is its own dataclass)."""
        if name not in self.stage_settings and name in STAGE_SECTIONS:  # kept, so a change to it holds
            self.stage_settings[name] = [settings() for _, settings in STAGE_SECTIONS[name]]
        if part is None and name in CORE_SECTIONS:
            return getattr(self, name)
        if name not in self.stage_settings:
            raise KeyError(f"no config section {name!r}")
        parts = self.stage_settings[name]
        if part is None:
            if len(parts) != 1:
                raise KeyError(f"config section {name!r} holds the keys of {len(parts)} features: read it by part "
                               f"({', '.join(type(p).__name__ for p in parts)})")
            return parts[0]
        found = [p for p in parts if type(p) is part]
        if not found:
            raise KeyError(f"config section {name!r} has no part {part.__name__}")
        return found[0]

    def with_keys(self, name: str, part: type | None = None, **changes: Any) -> SystemConfig:
        """A copy of this config with keys of section `name` (of its `part`, in a shared section) changed; this
        config stays as it is."""
        current = self.section(name) if part is None else self.section(name, part)
        changed = dataclasses.replace(current, **changes)
        if part is None and name in CORE_SECTIONS:  # SystemConfig's own keys, beside any parts stages add
            return dataclasses.replace(self, **{name: changed})
        return dataclasses.replace(self, stage_settings={
            section: [changed if p is current else p for p in parts] for section, parts in self.stage_settings.items()})

    def resolved(self) -> dict[str, Any]:
        """Every setting as plain data, the declared sections beside the others (a shared section's parts as one
        mapping): what run manifests and gate files record and compare."""
        data = dataclasses.asdict(self)
        for name, parts in data.pop("stage_settings").items():
            data[name] = {**data.get(name, {}), **{key: value for part in parts for key, value in part.items()}}
        return data

    def strategy_names(self) -> list[str]:
        """The stage names of the chosen strategy, in order."""
        if self.strategy not in self.strategies:
            raise ConfigError(f"{self.source}: strategy {self.strategy!r} is not in strategies"
                              f"{did_you_mean(self.strategy, self.strategies)}")
        return self.strategies[self.strategy]


# SystemConfig's own keys and their types (its sections' dataclasses).
CORE_SECTIONS = {f.name: typing.get_type_hints(SystemConfig)[f.name] for f in dataclasses.fields(SystemConfig)
                 if not f.metadata.get("internal")}

# Config sections declared by stages, by section name: its parts, each the module that declared it and its
# dataclass (a stage's own `settings`, or keys it adds to a shared section, `Stage.section_keys`). The loader builds
# each part from its keys of the section; the reference page lists them.
STAGE_SECTIONS: dict[str, list[tuple[str, type]]] = {}

def add_section(name: str, settings: type, owner: str, shared: bool = False) -> None:
    """Make the fields of `settings` (a dataclass) keys of the config section `name`, declared by `owner` (a
    module). `shared`: keys added to a section others declare keys of too, a SystemConfig section among them (none
    the same key); else the section is the stage's own. An owner declaring its part again replaces it."""
    if not dataclasses.is_dataclass(settings):
        raise ConfigError(f"{owner}: the settings of stage {name!r} must be a dataclass, not {settings!r}")
    if not shared and name in {f.name for f in dataclasses.fields(SystemConfig)}:
        raise ConfigError(f"{owner}: stage {name!r} declares settings, but {name!r} is already a config key")
    adapter(settings)  # a field type pydantic cannot check fails here, at import
    keys = {f.name for f in dataclasses.fields(settings)}
    core = CORE_SECTIONS.get(name)
    if shared and core is not None and not dataclasses.is_dataclass(core):
        raise ConfigError(f"{owner}: config key {name!r} is not a section")
    if core is not None and (clash := sorted(keys & {f.name for f in dataclasses.fields(core)})):
        raise ConfigError(f"{owner}: config key {name}.{clash[0]} is already a key of SystemConfig's {name!r}")
    parts = [(o, s) for o, s in STAGE_SECTIONS.get(name, []) if (o, s.__name__) != (owner, settings.__name__)]
    for other, declared in parts:
        if clash := sorted(keys & {f.name for f in dataclasses.fields(declared)}):
            raise ConfigError(f"{owner}: config key {name}.{clash[0]} is already declared by {other}")
    STAGE_SECTIONS[name] = [*parts, (owner, settings)]  # a new list: a refused stage's rollback restores the old


def declared_sections(modules: Iterable[str]) -> list[str]:
    """The declared sections with a part from one of `modules`."""
    wanted = set(modules)
    return [name for name, parts in STAGE_SECTIONS.items() if any(owner in wanted for owner, _ in parts)]


def resolve_path(path: str) -> Path:
    """A path from a config: absolute, or relative to the repository."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else REPO_ROOT / candidate
