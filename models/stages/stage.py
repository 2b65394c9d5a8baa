"""Stages: the base class and its declarations, the registry strategies name them from, the context one stage
sees in a batch, and the runner that times, budgets and isolates them.

A stage is one class in one file:

    @STAGES.register("my_stage")
    class MyStage(Stage):
        prompts = ("my_prompt",)        # prompts/<name>.yaml it renders (checked at start-up)
        settings = MySettings           # a dataclass: the config section `my_stage`, ctx.settings
        section_keys = {"answer": MyKeys}  # keys it adds to a section several stages share (ctx.section)
        sections = ("reasoning",)       # other config sections it reads (ctx.section)
        fields = (MY_FIELD,)            # QueryState fields it adds: MY_FIELD = StateField("my_field", list, ...)
        resources = {"my_index": Resource(build, depends=("embedder",))}  # resources it adds
        reads = frozenset({"references"})   # QueryState fields some earlier stage must write
        may_read = frozenset({"evidence"})  # fields it reads where a stage wrote them ("evidence": every block)
        writes = frozenset({"my_field"})    # QueryState fields it sets
        needs = frozenset({"llm", "my_index"})  # resources it uses (models/resources.py)
        signals = {"my_stage.score": "what it means"}  # the answer gate's signals it writes
        switch_on = ("my_stage.enabled=true",)  # where `active` can be False: the settings that turn it on
        closing = False                 # True: runs after the answer step, listed in no strategy (the gate)

        @classmethod
        def estimate(cls, config, prompts): ...  # its LLM calls per query, for the budget planner

        @classmethod
        def evidence_chars(cls, config): ...  # the most characters its evidence adds to an answer prompt (planner)

        @classmethod
        def outcome(cls, state): ...   # signals read off the answered query, whether the stage ran or not

        def run(self, states, ctx): ...

and one name in a strategy (`strategies:` in the config); a built-in stage's module is also named once in
models/loading.py STAGE_MODULES. Registering the class registers what it adds; the
stage is refused at import when it reads, writes or needs what nothing declares. CragSystem builds only the
resources the chosen stages need and refuses a pipeline in which a stage reads a field that no earlier stage
writes. While a stage runs, its states refuse a field it does not declare (models/state.py `guarded`): a stage's
declarations are what its code touches, or it fails.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from loguru import logger

from models.config import CHOICES, STAGE_SECTIONS, BudgetConfig, SystemConfig, add_choice, add_section
from models.estimates import StagePlan
from models.llm.backend import DEADLINE, FAILED, GenParams, Sample
from models.prompting import Messages, Prompt, PromptLibrary
from models.registry import Registry, RegistryError
from models.resources import RESOURCES, Resource, add_resource
from models.state import (
    ADDED_FIELDS,
    BATCH_INPUTS,
    EVIDENCE,
    OPEN_WRITES,
    QUERY_STATE_FIELDS,
    Ports,
    QueryState,
    Signal,
    StageRecord,
    StateField,
    add_field,
    guarded,
)
from utils.answers import IDK
from utils.time_budget import Deadline


class Stage:
    """Base class of every stage; see the module docstring for the declarations."""

    name: ClassVar[str] = ""
    prompts: ClassVar[tuple[str, ...]] = ()
    settings: ClassVar[type | None] = None
    section_keys: ClassVar[dict[str, type]] = {}
    sections: ClassVar[tuple[str, ...]] = ()
    fields: ClassVar[tuple[StateField[Any], ...]] = ()
    resources: ClassVar[dict[str, Resource]] = {}
    reads: ClassVar[frozenset[str]] = frozenset()
    may_read: ClassVar[frozenset[str]] = frozenset()
    writes: ClassVar[frozenset[str]] = frozenset()
    needs: ClassVar[frozenset[str]] = frozenset()
    signals: ClassVar[dict[str, str]] = {}
    # The settings (as --set takes them) that switch it on where `active` is False: `ablate`'s +STAGE.
    switch_on: ClassVar[tuple[str, ...]] = ()
    # A closing stage runs after the answer step, on every query, when active (the answer gate); no strategy lists it.
    closing: ClassVar[bool] = False

    @classmethod
    def active(cls, config: SystemConfig) -> bool:
        """Whether `config` switches this stage on; a strategy lists it either way (`knowledge.enabled: false`)."""
        return True

    @classmethod
    def estimate(cls, config: SystemConfig, prompts: PromptLibrary) -> list[StagePlan]:
        """The LLM calls one query makes in this stage under `config`, for the budget planner
        (models/budget_planner.py); none by default (a stage without LLM calls, or whose number of calls depends on
        the question)."""
        return []

    @classmethod
    def evidence_chars(cls, config: SystemConfig) -> int:
        """The most characters of evidence this stage's fields bring to one query's answer prompt under `config`,
        for the budget planner (models/stages/reasoning.py shown_evidence_chars); 0 by default (no evidence)."""
        return 0

    @classmethod
    def outcome(cls, state: QueryState) -> dict[str, Signal]:
        """The signals of `signals` read off a query once it has its answer (the answer step asks every stage its
        strategy names, switched on or not, so a signal has a value whether the stage ran or not); none by
        default."""
        return {}

    @classmethod
    def ports(cls) -> Ports:
        """The fields its code may touch while it runs: what it reads, may read and writes."""
        return Ports(cls.name, cls.reads | cls.may_read | cls.writes, cls.writes | OPEN_WRITES)

    def declared_signals(self) -> set[str]:
        """The signals this stage may write: those it declares in `signals`."""
        return set(self.signals)

    def setup(self, config: SystemConfig, resources: dict[str, Any]) -> None:
        """Start-up work (load a classifier, read demonstrations), once, before the first batch."""

    def run(self, states: list[QueryState], ctx: StageContext) -> None:
        """Read and write fields of the states still open."""
        raise NotImplementedError


class StageRegistry(Registry[Stage]):
    """Stages by name. Registering a stage registers what it adds (its settings section, QueryState fields and
    resources); a stage whose declarations name a QueryState field, resource or config section that nothing
    declares is refused at import, so a typo fails where it is written."""

    def register(self, name: str) -> Callable[[type[Stage]], type[Stage]]:
        add = super().register(name)

        def check(cls: type[Stage]) -> type[Stage]:
            if not (isinstance(cls, type) and issubclass(cls, Stage)):
                return add(cls)  # refused there, with the base class named
            keys = [(name, cls.settings, False)] if cls.settings is not None else []
            keys += [(section, part, True) for section, part in cls.section_keys.items()]
            with declaring(f"stage {name!r}", cls.__module__, keys, cls.fields, cls.resources):
                _check(name, cls)
                registered = add(cls)
            cls.name = name
            own = ((name,) if cls.settings is not None else ()) + tuple(cls.section_keys)
            cls.sections = tuple(dict.fromkeys((*own, *cls.sections)))  # its own section first: ctx.settings
            return registered

        return check


STAGES = StageRegistry("stage", Stage)


@contextlib.contextmanager
def declaring(what: str, owner: str, sections: Iterable[tuple[str, type, bool]], fields: Iterable[StateField[Any]],
              resources: dict[str, Resource], choices: Iterable[tuple[str, str]] = ()) -> Iterator[None]:
    """Register what `what` (a stage, a retriever) declared in module `owner` adds: config keys (section name,
    dataclass, whether the section is shared), QueryState fields, resources and values of `Choice` keys (table,
    name). Where that or the block raises a ValueError, nothing of it stays registered; a clash is a RegistryError
    naming `what`."""
    tables: tuple[dict[str, Any], ...] = (STAGE_SECTIONS, ADDED_FIELDS, RESOURCES, CHOICES)
    saved = [dict(table) for table in tables]
    try:
        try:
            for key, choice in choices:
                add_choice(key, choice)
            for section, settings, shared in sections:
                add_section(section, settings, owner, shared)
            for spec in fields:
                add_field(spec, owner)
            for resource_name, resource in resources.items():
                add_resource(resource_name, resource, owner)
        except ValueError as err:
            raise RegistryError(f"{what}: {err}") from err
        yield
    except ValueError:
        for table, before in zip(tables, saved):
            table.clear()
            table.update(before)
        raise


def _check(name: str, cls: type[Stage]) -> None:
    """Check that what stage `name` reads, writes, needs and is configured by is declared somewhere; RegistryError
    naming the stage where not."""
    if unknown := set(cls.reads | cls.may_read | cls.writes) - QUERY_STATE_FIELDS - set(ADDED_FIELDS) - {EVIDENCE}:
        raise RegistryError(f"stage {name!r}: reads/may_read/writes name no QueryState field: {sorted(unknown)}")
    if unknown := set(cls.needs) - set(RESOURCES):
        raise RegistryError(f"stage {name!r}: needs unknown resources {sorted(unknown)}; known: "
                            f"{', '.join(RESOURCES)}")
    if unknown := set(cls.sections) - {f.name for f in dataclasses.fields(SystemConfig)} - set(STAGE_SECTIONS):
        raise RegistryError(f"stage {name!r}: no config section {sorted(unknown)}")


def check_flow(stages: Iterable[Stage | type[Stage]]) -> None:
    """Refuse a pipeline in which a stage reads a field that neither the grader's batch nor an earlier stage
    writes."""
    written = set(BATCH_INPUTS)
    for stage in stages:
        missing = set(stage.reads) - written
        if missing:
            raise RegistryError(f"stage {stage.name!r} reads {sorted(missing)}, which no earlier stage writes "
                                f"(earlier: {sorted(written - BATCH_INPUTS) or 'none'}); put a stage that writes "
                                "them before it, or switch it on")
        written |= set(stage.writes)


@dataclass
class Batch:
    """What every stage of one batch shares: the batch deadline, the config, the prompts and the resources."""

    config: SystemConfig
    deadline: Deadline
    prompts: PromptLibrary
    resources: dict[str, Any]

    @classmethod
    def start(cls, config: SystemConfig, size: int, prompts: PromptLibrary, resources: dict[str, Any],
              clock: Callable[[], float] = time.monotonic) -> Batch:
        budget = config.budget
        return cls(config, Deadline.for_batch(max(size, 1), budget.per_query_s, budget.safety_margin_s, clock),
                   prompts, resources)

    def context(self, stage: Stage) -> StageContext:
        return StageContext(stage, self.deadline, self.config, self.prompts,
                            {name: self.resources.get(name) for name in stage.needs})


def stage_sections(stage: Stage | type[Stage], config: SystemConfig) -> dict[str, Any]:
    """The config sections `stage` reads, by name; of a section several stages share, the part it declares."""
    own = {stage.name: stage.settings, **stage.section_keys} if stage.settings is not None else stage.section_keys
    return {name: config.section(name, own[name]) if name in own else config.section(name)
            for name in stage.sections}


class StageContext:
    """One stage's view of a batch: its settings and declared resources, its prompts, the deadline, and
    `generate`, which sends a stage's conversations in one backend call within its share of the batch (and, with
    `record_prompts`, records each on the query it is for)."""

    def __init__(self, stage: Stage, deadline: Deadline, config: SystemConfig, prompts: PromptLibrary,
                 resources: dict[str, Any]) -> None:
        self.stage = stage
        self.deadline = deadline
        self.budget: BudgetConfig = config.budget
        self._config = config
        self._prompts = prompts
        self._sections = stage_sections(stage, config)
        self._resources = resources
        self._record_prompts = config.record_prompts

    @property
    def settings(self) -> Any:
        """The stage's own config section, named after it (`Stage.settings`)."""
        return self.section(self.stage.name)

    def section(self, name: str, part: type | None = None) -> Any:
        """A config section the stage declares it reads (`sections`); `part`: the keys another feature declares in
        it (the references stage reads its retriever's so)."""
        if name not in self._sections:
            raise RegistryError(f"stage {self.stage.name!r} reads config section {name!r} without declaring it")
        return self._sections[name] if part is None else self._config.section(name, part)

    def resource(self, name: str) -> Any:
        """The resource, or None where the config leaves it out (no reranker, no KG server)."""
        if name not in self._resources:
            raise RegistryError(f"stage {self.stage.name!r} uses resource {name!r} without declaring it in `needs`")
        return self._resources[name]

    def prompt(self, name: str) -> Prompt:
        if name not in self.stage.prompts:
            raise RegistryError(f"stage {self.stage.name!r} renders prompt {name!r} without declaring it")
        return self._prompts.get(name)

    def work_deadline(self) -> Deadline:
        """When this stage's work must end: the batch deadline less the answer reserve, and no later than the
        stage's `budget.stage_share` of the batch's seconds from now."""
        deadline = self.deadline.reserve(self.budget.answer_reserve_s)
        share = self.budget.stage_share.get(self.stage.name)
        return deadline.capped(share * self.deadline.total) if share else deadline

    def can_step(self, costed_as: str, waiting: Sequence[QueryState]) -> bool:
        """Whether the deadline affords one more LLM step of a multi-step stage: the answer reserve and the
        `budget.stage_min_s` of the stage named `costed_as` (1 s where the table leaves it out). Where it does
        not, the step is a deadline cut for each query `waiting` on it."""
        if self.deadline.can_afford(self.budget.stage_min_s.get(costed_as, 1.0) + self.budget.answer_reserve_s):
            return True
        self.cut(waiting, "no time for a step")
        return False

    def cut(self, states: Iterable[QueryState], what: str) -> None:
        """Note on each state that the deadline cut this stage's work on it (`QueryState.deadline_cuts`), once
        for each kind of cut."""
        cut = f"{self.stage.name}: {what}"
        for state in {id(s): s for s in states}.values():
            if cut not in state.deadline_cuts:
                state.deadline_cuts.append(cut)

    def generate(self, conversations: Sequence[Messages], *, owners: Sequence[QueryState], max_tokens: int,
                 temperature: float = 0.0, n: int = 1, stop: list[str] | None = None, seed: int | None = None,
                 deadline: Deadline | None = None, embeddings: list[np.ndarray] | None = None,
                 states: Iterable[QueryState] = (), logprobs: bool = False) -> list[list[Sample]]:
        """The samples of each conversation, in one backend call ending by `deadline` (default: the stage's work
        deadline). `owners` names the query each conversation is for, one to one: with the config's
        `record_prompts` on, the conversation and its samples are added to that query's `prompts`. `embeddings`
        (R2AG prompt mode) go with the conversations to the backend's generate_with_embeddings. Each distinct
        state in `states` counts one LLM step (multi-step stages pass them). `logprobs`: the samples carry their
        tokens' log-probabilities where the backend gives them (Sample.tokens, token_logprobs)."""
        if len(owners) != len(conversations):
            raise ValueError(f"stage {self.stage.name!r}: {len(owners)} owners for {len(conversations)} conversations")
        if not conversations:
            return []
        for state in {id(s): s for s in states}.values():
            state.steps += 1
        params = GenParams(max_tokens=max_tokens, temperature=temperature, n=n, stop=list(stop or []), seed=seed,
                           deadline=deadline or self.work_deadline(), logprobs=logprobs)
        llm = self.resource("llm")
        outputs = well_formed(llm.generate(conversations, params) if embeddings is None
                              else llm.generate_with_embeddings(conversations, embeddings, params),
                              len(conversations), self.stage.name)
        for owner, samples in zip(owners, outputs):
            owner.llm_calls += 1
            owner.llm_failures += [f"{self.stage.name}: {s.failure}" for s in samples if s.finish_reason == FAILED]
        self.cut([owner for owner, samples in zip(owners, outputs) if any(s.finish_reason == DEADLINE
                                                                          for s in samples)], "call cut")
        if self._record_prompts:
            for owner, conversation, samples in zip(owners, conversations, outputs):
                owner.prompts.append({"stage": self.stage.name, "prompt": conversation.prompt,
                                      "messages": [dict(message) for message in conversation],
                                      "replies": [sample.text for sample in samples]})
        return outputs


def run_alone(stage: Stage, states: list[QueryState], config: SystemConfig, resources: dict[str, Any],
              seconds: float = 3600.0, prompts: PromptLibrary | None = None) -> None:
    """Run one stage outside CragSystem (training tools, benchmarks, tests) in a batch of its own: these
    resources, `seconds` to spend, errors raised."""
    batch = Batch(config, Deadline(seconds), prompts or PromptLibrary(config.prompts), resources)
    with guarded(stage.ports(), states):
        stage.run(states, batch.context(stage))


def well_formed(outputs: Any, count: int, stage: str) -> list[list[Sample]]:
    """A backend's outputs as `count` lists of Samples, whatever it returned (a wrong length, a non-list, a sample
    that is not a Sample): what is missing or unusable is no sample, which the stages read as no answer for that
    query alone. Logged when anything had to be dropped."""
    rows = outputs if isinstance(outputs, list) else []
    fixed = [[s for s in row if isinstance(s, Sample)] if isinstance(row, list) else [] for row in rows[:count]]
    fixed += [[] for _ in range(count - len(fixed))]
    if len(rows) != count or any(not isinstance(row, list) or len(row) != len(kept) for row, kept in zip(rows, fixed)):
        logger.error("stage {}: the LLM backend returned {} for {} conversations; what was not a list of Samples "
                     "counts as no reply", stage, f"{len(rows)} outputs" if isinstance(outputs, list)
                     else type(outputs).__name__, count)
    return fixed


def _copy(value: Any) -> Any:
    """A copy to put back after a failed run; arrays are replaced by stages, never changed in place."""
    return value if isinstance(value, np.ndarray) else copy.deepcopy(value)


Snapshot = tuple[dict[str, Any], dict[str, Any]]


def _snapshot(stage: Stage, state: QueryState) -> Snapshot:
    """What `stage` may change on `state`, copied: its core fields (every stage's open ones among them) and the
    values of the added fields it writes."""
    core = {name: _copy(getattr(state, name)) for name in (stage.writes & QUERY_STATE_FIELDS | OPEN_WRITES) - {"trace"}}
    return core, {name: _copy(state.added[name]) for name in stage.writes - QUERY_STATE_FIELDS if name in state.added}


def _restore(stage: Stage, state: QueryState, snapshot: Snapshot) -> None:
    core, added = snapshot
    for name, value in core.items():
        setattr(state, name, value)
    for name in stage.writes - QUERY_STATE_FIELDS:
        if name in added:
            state.added[name] = added[name]
        else:
            state.added.pop(name, None)


def _run_isolated(stage: Stage, group: list[QueryState], batch: Batch, needed: float,
                  always: bool) -> list[tuple[QueryState, Exception]]:
    """Run `stage` on `group`; where it raises, put the group's states back as they were and run each half on
    its own, down to single queries, so a failure costs only the queries that cause it (one bad page or reply
    among 16 costs one answer, at about 2 log2(16) more runs of the stage). The states that failed alone, with
    their errors; a group the deadline leaves no time to split fails whole."""
    saved = [_snapshot(stage, state) for state in group]
    try:
        with guarded(stage.ports(), group):
            stage.run(group, batch.context(stage))
        undeclared = sorted({name for state in group for name in state.signals} - stage.declared_signals()
                            - {name for core, _ in saved for name in core["signals"]})
        if undeclared:
            raise RegistryError(f"stage {stage.name!r} wrote signals it does not declare in `signals`: {undeclared}")
        return []
    except Exception as err:  # one query's bad input or reply must not cost the batch its answers
        for state, snapshot in zip(group, saved):
            _restore(stage, state, snapshot)
        if len(group) == 1:
            return [(group[0], err)]
        if not always and not batch.deadline.can_afford(needed):
            logger.error("stage {} failed on {} queries ({}: {}) with no time left to find which query causes it",
                         stage.name, len(group), type(err).__name__, err)
            return [(state, err) for state in group]
        logger.warning("stage {} failed on {} queries ({}: {}); running it on each half to find the query that "
                       "causes it", stage.name, len(group), type(err).__name__, err)
        half = len(group) // 2
        return (_run_isolated(stage, group[:half], batch, needed, always)
                + _run_isolated(stage, group[half:], batch, needed, always))


def run_stage(stage: Stage, states: list[QueryState], batch: Batch, always: bool = False) -> None:
    """Run `stage` on the queries still open, if the deadline affords it; a query whose input or reply makes it
    crash answers IDK, with the error in its trace, and the others go on (`_run_isolated`).

    `always` runs it on every query whatever the deadline (the answer step).
    """
    active = list(states) if always else [s for s in states if not s.done]
    if not active:
        return
    budget = batch.config.budget
    needed = budget.stage_min_s.get(stage.name, 0.0) + budget.answer_reserve_s
    if not always and not batch.deadline.can_afford(needed):
        note = f"{batch.deadline.remaining():.2f} s left, needs {needed:.2f} s"
        logger.warning("stage {} skipped for {} queries: {}", stage.name, len(active), note)
        for state in active:
            state.trace.append(StageRecord(stage.name, "skipped", 0.0, note))
            state.deadline_cuts.append(f"{stage.name}: skipped")
        return
    started = time.perf_counter()
    failed = {id(state): err for state, err in _run_isolated(stage, active, batch, needed, always)}
    elapsed = time.perf_counter() - started
    for state in active:
        err = failed.get(id(state))
        note = f"{type(err).__name__}: {err}" if err is not None else ""
        if err is not None:
            logger.opt(exception=err).error("stage {} failed for {}: {}", stage.name, state.interaction_id, note)
            if not state.done:
                state.finish(IDK, f"{stage.name} failed: {note}")
        state.trace.append(StageRecord(stage.name, "failed" if err is not None else "ok", elapsed, note))
