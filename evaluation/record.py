"""A question's record, typed: one line of a run folder's predictions.jsonl as the report, report.html, error
attribution and the answer gate read it.

The line's JSON object stays the record's storage (`Record.data`): each field reads its key (None where the line
has none, as in a run folder written before the key existed) and writes it back, so a line of any earlier run
folder is read as it is and written back unchanged, keys the code does not know included. Who writes which keys:
the runner (the example's fields, `prediction`, the batch's seconds and size, `timed_out`, `trace`: the model's
`QueryState.record()`), the judge (verdicts, who judged, reasons, `ungated`), attribution (`attribution`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar, overload

import models.loading  # noqa: F401  (registers the built-in stages' fields, which a trace holds by their names)
from evaluation.verdicts import UNJUDGED
from models.gate.gate_stage import GATE
from models.state import ADDED_FIELDS, StateField

T = TypeVar("T")
OVER_LIMIT = "batch: over the time limit"  # a deadline cut of the whole batch: the runner answered for the model


class Key(Generic[T]):
    """A field of Record: the line's key of the same name, None where the line has none."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    @overload
    def __get__(self, record: None, owner: type) -> Key[T]: ...

    @overload
    def __get__(self, record: Record, owner: type) -> T | None: ...

    def __get__(self, record: Record | None, owner: type) -> Key[T] | T | None:
        return self if record is None else record.data.get(self.key)

    def __set__(self, record: Record, value: T | None) -> None:
        record.data[self.key] = value


class Record:
    """One question's record over its JSON object (`data`); see the module docstring."""

    __slots__ = ("data",)

    # the example's fields (the runner copies them: evaluation/runner.py RECORD_FIELDS)
    interaction_id: Key[str] = Key()
    query: Key[str] = Key()
    query_time: Key[str] = Key()
    answer: Key[str] = Key()
    alt_answers: Key[list[str]] = Key()
    domain: Key[str] = Key()
    question_type: Key[str] = Key()
    static_or_dynamic: Key[str] = Key()
    popularity: Key[str] = Key()
    split: Key[int] = Key()
    # the answer and how it came
    prediction: Key[Any] = Key()  # what UserModel returned: a string, or anything a broken model gives
    batch_seconds: Key[float] = Key()
    batch_size: Key[int] = Key()
    timed_out: Key[bool] = Key()
    trace: Key[dict[str, Any]] = Key()  # the model's QueryState.record()
    # the judge's (evaluation/judge.py judge_records), ours and the organisers' rules'
    null_prediction: Key[bool] = Key()
    cut_by_grader: Key[bool] = Key()
    verdict: Key[str] = Key()
    judged_by: Key[str] = Key()
    judge_reason: Key[str] = Key()
    judge_confidence: Key[float] = Key()
    organisers_verdict: Key[str] = Key()
    organisers_judged_by: Key[str] = Key()
    ungated: Key[dict[str, Any]] = Key()  # the withheld answer's verdicts, where the answer gate withheld one
    attribution: Key[str] = Key()  # where a miss lost its gold answer (evaluation/attribution.py CLASSES)

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def has(self, key: str) -> bool:
        return key in self.data

    def __getitem__(self, key: str) -> Any:
        """A key by name (a breakdown's, a verdict's chosen at run time)."""
        return self.data.get(key)

    @property
    def stages(self) -> list[dict[str, Any]]:
        """The trace's stage records ({stage, status, seconds, note}), in order."""
        return (self.trace or {}).get("stages") or []

    @property
    def reason(self) -> str | None:
        """The pipeline's reason for the answer (the trace's `reason`)."""
        return (self.trace or {}).get("reason")

    @property
    def references(self) -> list[dict[str, Any]]:
        """The references the prompt was given, best first ({page, url, kind, score, relevance, text})."""
        return (self.trace or {}).get("references") or []

    def value(self, spec: StateField[T]) -> T | None:
        """A field a stage declares, as the trace recorded it (read back by the field's `load`); None where the
        trace has none."""
        raw = (self.trace or {}).get(spec.name)
        return None if raw is None else spec.load(raw) if spec.load else raw

    def evidence(self, listed: bool = True) -> list[tuple[StateField[Any], list[Any]]]:
        """Each recorded field that declares `Evidence`, with its lines, in declaration order; `listed`: only the
        blocks every answer prompt lists (the KG's rows, the calculations), not those a prompt must name (another
        model's answer)."""
        found = []
        for _, spec in ADDED_FIELDS.values():
            if spec.evidence is not None and (spec.evidence.listed or not listed):
                value = self.value(spec)
                if lines := spec.evidence.lines(value) if value is not None else []:
                    found.append((spec, lines))
        return found

    @property
    def golds(self) -> list[Any]:
        """The gold answer and its alternatives, as the line holds them."""
        return [self.answer, *(self.alt_answers or [])]

    @property
    def failures(self) -> list[str]:
        """Why this answer is not final: each LLM call that got no reply ("stage: why"), then each stage that
        raised ("stage failed: why"); empty for a final answer. A resumed run answers such a question again."""
        calls = [str(f) for f in (self.trace or {}).get("llm_failures") or []]
        return calls + [f"{s.get('stage')} failed: {s.get('note')}" for s in self.stages if s.get("status") == "failed"]

    @property
    def llm_steps(self) -> int:
        """The LLM steps a multi-step strategy took (0 where it took none or recorded none)."""
        return int((self.trace or {}).get("steps") or 0)

    @property
    def llm_calls(self) -> int | None:
        """The LLM conversations the system sent for this question; None in a run that did not record them."""
        calls = (self.trace or {}).get("llm_calls")
        return int(calls) if isinstance(calls, int) else None

    @property
    def deadline_cuts(self) -> list[str] | None:
        """Where the batch deadline cut this question's work, as "stage: what" (empty where it cut none), and a
        batch over the grader's limit; None in a run that did not record them."""
        cuts = (self.trace or {}).get("deadline_cuts")
        over = [OVER_LIMIT] if self.timed_out else []
        return over + [str(c) for c in cuts] if isinstance(cuts, list) else over or None

    @property
    def signals(self) -> dict[str, Any] | None:
        """The answer gate's inputs (the trace's `signals`), None where the run recorded none."""
        signals = (self.trace or {}).get("signals")
        return signals if isinstance(signals, dict) and signals else None

    @property
    def gate(self) -> dict[str, Any] | None:
        """What the answer gate did (the trace's `gate`: P(correct), the threshold, the withheld answer)."""
        gate = self.value(GATE)
        return gate if isinstance(gate, dict) else None

    @property
    def withheld(self) -> str | None:
        """The answer the answer gate withheld, None where it withheld none."""
        withheld = (self.gate or {}).get("withheld")
        return withheld if isinstance(withheld, str) else None

    @property
    def scored_verdict(self) -> str:
        """The verdict as scores count it: UNJUDGED where no judge has given one."""
        return self.verdict or UNJUDGED

    def without_gate(self) -> Record:
        """The record as it would be without the answer gate: the withheld answer as its prediction, with its
        verdicts (`ungated`, written by the judge), over a new object; the record itself where the gate withheld
        nothing."""
        return Record({**self.data, **self.ungated}) if self.withheld is not None and self.ungated else self


def as_record(line: Record | dict[str, Any]) -> Record:
    """A record over `line`, or `line` where it is one already."""
    return line if isinstance(line, Record) else Record(line)


def records_of(lines: Iterable[dict[str, Any]]) -> list[Record]:
    """Records over the lines' JSON objects (not copies: what a Record writes, the line holds)."""
    return [Record(line) for line in lines]
