"""QueryState: one query's inputs, intermediate results and trace as it moves through the stages, and the ports
through which a stage reads and writes it.

A feature's own fields are `StateField`s, declared by the stage that brings them and read as `state[FIELD]`, typed
for mypy by the field's value type. While a stage runs (`guarded`), its states refuse a read or write the stage did
not declare (`Ports`): a misdeclared stage fails in its first batch, not silently. A field whose value is evidence
the answer may quote declares an `Evidence`: the answer prompts render every such block (`evidence_blocks`), and the
checks ask `grounded()` instead of naming a feature's field.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

import numpy as np

from utils.errors import HarnessError

Signal = float | int | bool | str | None
T = TypeVar("T")

# The QueryState fields the grader's batch fills (models/system.py unpack_batch); stages write the others.
BATCH_INPUTS = frozenset({"index", "interaction_id", "query", "query_time", "pages"})
# Read in a stage's declarations: every evidence block of the query (`QueryState.evidence_blocks`), whichever stage
# wrote it.
EVIDENCE = "evidence"


class StateFieldError(ValueError):
    """A stage's field clashes with a QueryState field or with another stage's field of that name."""


class PortError(HarnessError):
    """A stage read or wrote a QueryState field it does not declare (`Stage.reads`, `may_read`, `writes`)."""


@dataclass(frozen=True)
class Evidence:
    """How a field's value reaches the answer prompts: a block with a `title`, a `kind` ("kg", "calculation", ...)
    and its `lines`, read off the value. `grounds`: the block is a source of its own (the KG's rows), which the
    evidence checks count and the answer's support signals search; derived blocks (a calculation, another model's
    answer) do not. `listed` False: only a prompt that names the field shows it, not a prompt's list of every
    block (HASH-RAG's propositions, which only its PGCC prompt lays out)."""

    title: str
    kind: str
    lines: Callable[[Any], list[Any]] = list
    grounds: bool = False
    listed: bool = True


@dataclass(frozen=True)
class EvidenceBlock:
    """One field's evidence on one query, as a prompt renders it (`block.title`, `block.lines`)."""

    name: str
    title: str
    kind: str
    lines: list[Any]
    grounds: bool
    listed: bool


@dataclass(frozen=True, eq=False)
class StateField(Generic[T]):
    """A field a stage adds to QueryState (`Stage.fields`), read and written as `state[FIELD]`: its name, its
    starting value (made afresh for each query) and how the per-question record writes it (None: the record leaves
    it out; `record_none` False: left out while None). `evidence`: its value is evidence the answer prompts render.
    `load`: its value from the plain data `dataclasses.asdict` made of it (a saved state read back); None: the data
    as it is."""

    name: str
    default: Callable[[], T]
    record: Callable[[T], Any] | None = None
    doc: str = ""
    record_none: bool = True
    evidence: Evidence | None = None
    load: Callable[[Any], T] | None = None


# Fields added by stages, by name, with the module that declared each.
ADDED_FIELDS: dict[str, tuple[str, StateField[Any]]] = {}


def add_field(spec: StateField[Any], owner: str) -> None:
    """Register `spec` (declared by `owner`, a module); the same owner may declare it again."""
    name = spec.name
    if name in QUERY_STATE_FIELDS | _RECORD_KEYS | {EVIDENCE}:
        raise StateFieldError(f"{owner}: field {name!r} is already a QueryState field or a key of its record")
    taken = ADDED_FIELDS.get(name)
    if taken is not None and taken[0] != owner:
        raise StateFieldError(f"{owner}: field {name!r} is already added by {taken[0]}")
    ADDED_FIELDS[name] = (owner, spec)


@dataclass(frozen=True)
class Ports:
    """What one stage may touch: the fields it reads (`reads`, `may_read` and `writes`) and those it `writes`."""

    owner: str
    reads: frozenset[str]
    writes: frozenset[str]

    def check(self, name: str, write: bool) -> None:
        if name not in (self.writes if write else self.reads):
            verb, table = ("writes", "writes") if write else ("reads", "reads` or `may_read")
            raise PortError(f"stage {self.owner!r} {verb} QueryState field {name!r} without declaring it in "
                            f"`{table}`")


_PORTS: ContextVar[Ports | None] = ContextVar("ports", default=None)


@dataclass
class Reference:
    """A piece of evidence shown to the LLM, with where it came from."""

    text: str
    kind: str  # "chunk", "snippet" or "table"
    page_name: str = ""
    page_url: str = ""
    page_last_modified: str = ""
    score: float = 0.0
    relevance: float | None = None  # R2AG: the R2-Former's query-document-matching probability

    def embedded_as(self) -> str:
        """The text its vector is computed from: a snippet with its page's title (the page's header, which ranks
        a query's many pages: references.max_pages), any other reference as it is."""
        return " ".join(part for part in (self.page_name, self.text) if part) if self.kind == "snippet" else self.text


@dataclass
class StageRecord:
    stage: str
    status: str  # "ok", "skipped" or "failed"
    seconds: float = 0.0
    note: str = ""


@dataclass(slots=True)  # slots: a misspelt field (`state.refrences = ...`) is an AttributeError, not a new attribute
class QueryState:
    index: int
    interaction_id: str
    query: str
    query_time: str
    pages: list[Mapping[str, Any]]
    references: list[Reference] = field(default_factory=list)
    # Embeddings from the references stage, rows aligned with `references` (a stage that re-orders or drops
    # references re-orders these too); kept in memory only, never cached.
    query_vector: np.ndarray | None = field(default=None, repr=False)
    reference_vectors: np.ndarray | None = field(default=None, repr=False)
    # Every candidate of the query's pages (before selection) and its embedding, for sub-query retrieval.
    candidates: list[Reference] = field(default_factory=list, repr=False)
    candidate_vectors: np.ndarray | None = field(default=None, repr=False)
    domain: str | None = None         # attributes: finance, sports, music, movie, open
    dynamism: str | None = None       # attributes: static, slow-changing, fast-changing, real-time
    # The LLM steps the query used (each distinct query of a ctx.generate call counts one).
    steps: int = 0
    # The LLM conversations sent for this query, one per conversation of a ctx.generate call it owns.
    llm_calls: int = 0
    # Each LLM call of this query that got no reply, as "stage: why" (StageContext.generate): its answer is not
    # final, and a resumed run asks again.
    llm_failures: list[str] = field(default_factory=list)
    # Where the batch deadline cut this query's work, each kind once, as "stage: what" (a call it ended, a step or
    # stage it left out): an answer the clock shaped, which a comparison of two setups must not credit to either.
    deadline_cuts: list[str] = field(default_factory=list)
    llm_output: str | None = None
    answer: str | None = None
    done: bool = False
    done_reason: str = ""
    trace: list[StageRecord] = field(default_factory=list)
    # What the stages knew of how sure the answer is, by name ("reasoning.answer_logprob_mean", ...): the inputs of a
    # closing stage that weighs the answer, kept on every record.
    signals: dict[str, Signal] = field(default_factory=dict)
    # With the config's `record_prompts` on: every LLM conversation of this query, in call order, as {"stage",
    # "prompt" (its name), "messages", "replies" (the samples' texts)}; StageContext.generate appends them.
    prompts: list[dict[str, Any]] = field(default_factory=list)
    # Evidence a prompt was rendered without, as "prompt: block" (models/evidence.py): a block that never reached
    # the LLM is in the record, not lost unseen.
    unshown: list[str] = field(default_factory=list)
    # The values of the fields stages add (ADDED_FIELDS), set on first use (a field never used is not recorded).
    added: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getitem__(self, spec: StateField[T]) -> T:
        """The value of a field a stage adds (its default until one is set)."""
        self._port(spec, write=False)
        return cast(T, self.added.setdefault(spec.name, spec.default()))

    def __setitem__(self, spec: StateField[T], value: T) -> None:
        self._port(spec, write=True)
        self.added[spec.name] = value

    def _port(self, spec: StateField[Any], write: bool) -> None:
        if ADDED_FIELDS.get(spec.name, (None, None))[1] is not spec:
            raise StateFieldError(f"field {spec.name!r} is not registered: its stage's module was not imported, or "
                                  "another declared that name")
        if (ports := _PORTS.get()) is not None:
            ports.check(spec.name, write)

    def record(self) -> dict[str, Any]:
        """What the query went through, for the run folder's per-question record: the reason for its answer,
        each stage's status and seconds, the predicted attributes, the references chosen for the prompt (best
        first; the prompt takes them while they fit), the LLM steps and calls, the confidence signals, the LLM
        calls that failed (`llm_failures`; no such key when none did), where the deadline cut its work
        (`deadline_cuts`, always: a record without the key predates them); with `record_prompts` on, every LLM
        conversation and its replies (`prompts`; no such key when none was recorded); the evidence a prompt left out
        (`unshown`, likewise); then the fields stages add (`Stage.fields`), as each declares."""
        record = {"interaction_id": self.interaction_id, "reason": self.done_reason,
                  "stages": [dataclasses.asdict(r) for r in self.trace],
                  "predicted": {"domain": self.domain, "dynamism": self.dynamism},
                  "references": [{"page": r.page_name, "url": r.page_url, "updated": r.page_last_modified,
                                  "kind": r.kind, "score": round(r.score, 4), "relevance": r.relevance,
                                  "text": r.text} for r in self.references],
                  "steps": self.steps, "llm_calls": self.llm_calls, "deadline_cuts": self.deadline_cuts,
                  "signals": self.signals}
        for name in ("llm_failures", "prompts", "unshown"):
            if value := getattr(self, name):
                record[name] = value
        for name, (_, spec) in ADDED_FIELDS.items():
            if name in self.added and spec.record is not None and (spec.record_none or self.added[name] is not None):
                record[name] = spec.record(self.added[name])
        return record

    def evidence_blocks(self) -> list[EvidenceBlock]:
        """The evidence the stages wrote on this query, a block per field that declares `evidence` and has lines,
        in the order the fields were declared."""
        if (ports := _PORTS.get()) is not None:
            ports.check(EVIDENCE, write=False)
        blocks = []
        for name, (_, spec) in ADDED_FIELDS.items():
            if spec.evidence is not None and name in self.added and (lines := spec.evidence.lines(self.added[name])):
                blocks.append(EvidenceBlock(name, spec.evidence.title, spec.evidence.kind, lines,
                                            spec.evidence.grounds, spec.evidence.listed))
        return blocks

    def grounding_blocks(self) -> list[EvidenceBlock]:
        """The blocks of evidence that are a source of their own beside the pages' references (`Evidence.grounds`:
        the KG's rows)."""
        return [block for block in self.evidence_blocks() if block.grounds]

    def grounded(self) -> bool:
        """Whether a block of evidence that is a source of its own backs an answer besides the pages' references."""
        return bool(self.grounding_blocks())

    def finish(self, answer: str, reason: str) -> None:
        """Fix the answer now; later LLM stages leave this query alone."""
        self.answer = answer
        self.done = True
        self.done_reason = reason


QUERY_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(QueryState))
_RECORD_KEYS = frozenset({"reason", "stages", "predicted"})  # record() keys that are not field names
# Read and written by any stage: the batch's inputs are read-only to all (their writes are checked), the answer and
# what ctx.generate and the runner keep (steps, failed and cut calls, prompts, the trace, signals) are every stage's.
OPEN_READS = BATCH_INPUTS | {"answer", "done", "done_reason", "steps", "llm_calls", "llm_failures", "deadline_cuts",
                             "prompts", "signals", "trace", "unshown", "added"}
OPEN_WRITES = OPEN_READS - BATCH_INPUTS - {"added"}


class GuardedState(QueryState):
    """A QueryState while a stage runs (`guarded`): a read or write of a core field outside the stage's ports is a
    PortError. Only the class differs, so the state is the same object before, during and after."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        if name in _CHECKED_FIELDS and (ports := _PORTS.get()) is not None:
            ports.check(name, write=False)
        return object.__getattribute__(self, name)

    def __repr__(self) -> str:  # a log line's or a traceback's view of the state is no stage's read
        token = _PORTS.set(None)
        try:
            return QueryState.__repr__(self)
        finally:
            _PORTS.reset(token)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in QUERY_STATE_FIELDS and name not in OPEN_WRITES and (ports := _PORTS.get()) is not None:
            ports.check(name, write=True)
        object.__setattr__(self, name, value)


_CHECKED_FIELDS = QUERY_STATE_FIELDS - OPEN_READS


@contextlib.contextmanager
def guarded(ports: Ports, states: Iterable[QueryState]) -> Iterator[None]:
    """Hold `states` to `ports` for the block; nested, the inner ports apply within it (the answer step reads each
    stage's signals as that stage)."""
    swapped = [state for state in states if type(state) is QueryState]
    for state in swapped:
        state.__class__ = GuardedState
    token = _PORTS.set(ports)
    try:
        yield
    finally:
        _PORTS.reset(token)
        for state in swapped:
            state.__class__ = QueryState
