"""QueryState: one query's inputs, intermediate results and trace as it moves through the stages."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Signal = float | int | bool | str | None

# The QueryState fields the grader's batch fills (models/system.py unpack_batch); stages write the others.
BATCH_INPUTS = frozenset({"index", "interaction_id", "query", "query_time", "pages"})


class StateFieldError(ValueError):
    """A stage's field clashes with a QueryState field or with another stage's field of that name."""


@dataclass(frozen=True)
class StateField:
    """A field a stage adds to QueryState (`Stage.fields`): its starting value, made afresh for each query, and how
    the per-question record writes it (None: the record leaves it out; `record_none` False: left out while None).
    `evidence`: its value is lines of evidence the answer may quote, as the references' texts are (the answer
    step's support signals read them). `load`: its value from the plain data `dataclasses.asdict` made of it (a
    saved state read back); None: the data as it is."""

    default: Callable[[], Any]
    record: Callable[[Any], Any] | None = None
    doc: str = ""
    record_none: bool = True
    evidence: bool = False
    load: Callable[[Any], Any] | None = None


# Fields added by stages, by name, with the module that declared each; read and written as QueryState attributes.
ADDED_FIELDS: dict[str, tuple[str, StateField]] = {}


def add_field(name: str, spec: StateField, owner: str) -> None:
    """Make `name` a QueryState attribute (declared by `owner`, a module); the same owner may declare it again."""
    if name in QUERY_STATE_FIELDS | _RECORD_KEYS:
        raise StateFieldError(f"{owner}: field {name!r} is already a QueryState field or a key of its record")
    taken = ADDED_FIELDS.get(name)
    if taken is not None and taken[0] != owner:
        raise StateFieldError(f"{owner}: field {name!r} is already added by {taken[0]}")
    ADDED_FIELDS[name] = (owner, spec)


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


@dataclass
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
    knowledge: str | None = None      # the knowledge extractor's answer ("an answer from another agent")
    calculations: list[str] = field(default_factory=list)  # "expression = value", from the calculator
    # The LLM steps the query used (each distinct query of a ctx.generate call counts one).
    steps: int = 0
    # Each LLM call of this query that got no reply, as "stage: why" (StageContext.generate): its answer is not
    # final, and a resumed run asks again.
    llm_failures: list[str] = field(default_factory=list)
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
    # The values of the fields stages add (ADDED_FIELDS), set on first use (a field never used is not recorded).
    added: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getattr__(self, name: str) -> Any:  # only for names that are not dataclass fields
        found = ADDED_FIELDS.get(name)
        if found is None or name == "added":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.added.setdefault(name, found[1].default())

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ADDED_FIELDS:
            self.added[name] = value
        else:
            super().__setattr__(name, value)

    def record(self) -> dict[str, Any]:
        """What the query went through, for the run folder's per-question record: the reason for its answer,
        each stage's status and seconds, the predicted attributes, the references chosen for the prompt (best
        first; the prompt takes them while they fit), the calculator's lines, the knowledge extractor's answer, the
        LLM steps, the confidence signals, the LLM calls that failed (`llm_failures`; no such key when none did);
        with `record_prompts` on, every LLM conversation and its replies
        (`prompts`; no such key when none was recorded); then the fields stages add (`Stage.fields`), as each
        declares."""
        record = {"interaction_id": self.interaction_id, "reason": self.done_reason,
                  "stages": [dataclasses.asdict(r) for r in self.trace],
                  "predicted": {"domain": self.domain, "dynamism": self.dynamism},
                  "references": [{"page": r.page_name, "url": r.page_url, "updated": r.page_last_modified,
                                  "kind": r.kind, "score": round(r.score, 4), "relevance": r.relevance,
                                  "text": r.text} for r in self.references],
                  "calculations": self.calculations,
                  "knowledge": self.knowledge, "steps": self.steps, "signals": self.signals}
        if self.llm_failures:
            record["llm_failures"] = self.llm_failures
        if self.prompts:
            record["prompts"] = self.prompts
        for name, (_, spec) in ADDED_FIELDS.items():
            if name in self.added and spec.record is not None and (spec.record_none or self.added[name] is not None):
                record[name] = spec.record(self.added[name])
        return record

    def evidence(self) -> list[str]:
        """The lines of the fields stages declare as evidence (the KG's results), in declaration order; a field no
        stage set is none."""
        return [line for name, (_, spec) in ADDED_FIELDS.items() if spec.evidence
                for line in self.added.get(name) or []]

    def finish(self, answer: str, reason: str) -> None:
        """Fix the answer now; later LLM stages leave this query alone."""
        self.answer = answer
        self.done = True
        self.done_reason = reason


QUERY_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(QueryState))
_RECORD_KEYS = frozenset({"reason", "stages", "predicted"})  # record() keys that are not field names
