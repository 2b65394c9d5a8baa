"""SystemConfig: the whole system's settings, its sections (models/config/sections.py) and the sections stages
declare (`Stage.settings`, registered in STAGE_SECTIONS); the dataclass defaults are the base every config file
changes. Loading is models/config/loader.py."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from models.config.sections import (
    AnswerConfig,
    AttributesConfig,
    BudgetConfig,
    CalculatorConfig,
    DualRAGConfig,
    EmbedderConfig,
    HANRAGConfig,
    KGConfig,
    KnowledgeConfig,
    LLMConfig,
    R2AGConfig,
    ReasoningConfig,
    ReferencesConfig,
    between,
)
from utils.batch import MAX_BATCH_SIZE
from utils.errors import ConfigError
from utils.names import did_you_mean

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

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

    batch_size: int = field(default=4, metadata=between(1, MAX_BATCH_SIZE))
    """Queries per batch (what get_batch_size() tells the grader)."""
    task: Literal[1, 2, 3] = 1
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
    r2ag: R2AGConfig = field(default_factory=R2AGConfig)
    """The optional R2AG stage (docs/methods/r2ag.md)."""
    kg: KGConfig = field(default_factory=KGConfig)
    """The KG stage (tasks 2 and 3) over the CRAG mock API."""
    hanrag: HANRAGConfig = field(default_factory=HANRAGConfig)
    """HANRAG: strategy hanrag, or multihop: hanrag."""
    dualrag: DualRAGConfig = field(default_factory=DualRAGConfig)
    """DualRAG: strategy dualrag, or multihop: dualrag."""
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    """The knowledge extractor: the LLM answers without references; its answer reaches reasoning as "another
    agent's answer"."""
    calculator: CalculatorConfig = field(default_factory=CalculatorConfig)
    """The calculator: the LLM writes arithmetic, utils/safe_eval computes it."""
    reasoning: ReasoningConfig = field(default_factory=ReasoningConfig)
    """The final answer prompt."""
    answer: AnswerConfig = field(default_factory=AnswerConfig)
    """The dynamic pre-check and the answer gate."""
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    """The batch deadline and what each stage may spend of it, in seconds."""
    prompts: dict[str, str] = field(default_factory=dict)
    """Prompt variants: `name: path/to/variant.yaml` replaces prompts/<name>.yaml (paths from the repository)."""
    record_prompts: bool = False
    """Write each query's LLM conversations and replies into its record (`prompts` in predictions.jsonl's trace).
    Off: prompts are large. It changes no answer, so the run manifest leaves it out."""
    source: str = field(default="<defaults>", metadata={"internal": True})
    """The file(s) and --set keys the config was loaded from (set by the loader, not a key)."""
    stage_settings: dict[str, Any] = field(default_factory=dict, metadata={"internal": True})
    """The sections stages declare (`Stage.settings`, STAGE_SECTIONS) that the config sets or its strategy names,
    by stage name (set by the loader; `section` reads them)."""

    def __post_init__(self) -> None:
        """The checks that span keys; each key's own type, choices and range are checked as it loads."""
        self.strategy_names()  # an unknown strategy fails at load
        if self.r2ag.enabled and not self.r2ag.checkpoint:
            raise ConfigError(f"{self.source}: r2ag.enabled needs r2ag.checkpoint (train one with "
                              "tools/train_r2former.py)")
        if self.references.retriever == "hash" and not self.references.hash.model:
            raise ConfigError(f"{self.source}: references.retriever hash needs references.hash.model (train one with "
                              "tools/train_hash.py)")
        if self.budget.per_query_s <= self.budget.safety_margin_s / max(self.batch_size, 1):
            raise ConfigError(f"{self.source}: budget.per_query_s is too small for the safety margin")

    def section(self, name: str) -> Any:
        """The settings section `name`: a SystemConfig section, or one a stage declares (its defaults where the
        config does not set it)."""
        if name in self.stage_settings:
            return self.stage_settings[name]
        if name in STAGE_SECTIONS:
            return STAGE_SECTIONS[name][1]()
        return getattr(self, name)

    def resolved(self) -> dict[str, Any]:
        """Every setting as plain data, stage-declared sections beside the others: what run manifests and gate
        files record and compare."""
        data = dataclasses.asdict(self)
        data.update(data.pop("stage_settings"))
        return data

    def strategy_names(self) -> list[str]:
        """The stage names of the chosen strategy, in order."""
        if self.strategy not in self.strategies:
            raise ConfigError(f"{self.source}: strategy {self.strategy!r} is not in strategies"
                              f"{did_you_mean(self.strategy, self.strategies)}")
        return self.strategies[self.strategy]


# Config sections declared by stages (`Stage.settings`), by stage name, with the module that declared each: the
# loader builds them from the key of that name, the reference page lists their keys.
STAGE_SECTIONS: dict[str, tuple[str, type]] = {}


def add_section(name: str, settings: type, owner: str) -> None:
    """Make `name` a config section of `settings` (a dataclass), declared by `owner` (a module)."""
    if not dataclasses.is_dataclass(settings):
        raise ConfigError(f"{owner}: the settings of stage {name!r} must be a dataclass, not {settings!r}")
    if name in {f.name for f in dataclasses.fields(SystemConfig)}:
        raise ConfigError(f"{owner}: stage {name!r} declares settings, but {name!r} is already a config key")
    taken = STAGE_SECTIONS.get(name)
    if taken is not None and taken[0] != owner:
        raise ConfigError(f"{owner}: config section {name!r} is already declared by {taken[0]}")
    STAGE_SECTIONS[name] = (owner, settings)


def resolve_path(path: str) -> Path:
    """A path from a config: absolute, or relative to the repository."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else REPO_ROOT / candidate
