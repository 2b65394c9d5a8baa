"""Runs a UserModel over examples batch by batch; predictions are appended per batch so a re-run resumes."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from loguru import logger
from tqdm import tqdm

from evaluation.record import Record
from utils.answers import IDK
from utils.batch import BatchResult, answer_batch, batch_size_problem, make_batch
from utils.durable_io import append_lines, json_line, jsonl_lines, open_text, write_atomic
from utils.errors import HarnessError
from utils.html import clean_text
from utils.time_budget import Deadline

LOOK_S = 0.5  # how often a running batch's deadline is looked at
RECORD_FIELDS = ("interaction_id", "query", "query_time", "answer", "alt_answers", "domain", "question_type",
                 "static_or_dynamic", "popularity", "split")


class EvaluationError(HarnessError, RuntimeError):
    """The model broke the grader's contract; finished predictions are kept."""


def load_predictions(path: Path) -> dict[str, dict[str, Any]]:
    """Finished records by interaction_id. A torn last line (an interrupted write) is cut off the file."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        logger.warning("{}: dropping an incomplete last line from an interrupted run", path)
        with path.open("r+b") as handle:
            handle.truncate(keep)
        data = data[:keep]
    records = {}
    for number, line in enumerate(jsonl_lines(data.decode("utf-8")), start=1):
        try:
            record = json.loads(line)
            records[record["interaction_id"]] = record
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise EvaluationError(
                f"{path}:{number}: unreadable prediction ({err}); delete the file or use --restart"
            ) from err
    return records


def save_judgements(path: Path, judged: list[dict[str, Any]]) -> None:
    """Write the judged records (verdicts, the judge's reasons, attribution) over their lines of `path`; the
    lines of other questions stay as they are. Written atomically (utils/durable_io.py), so a crash or a full disk at
    any point leaves the old file."""
    updates = {r["interaction_id"]: r for r in judged}
    records = load_predictions(path)
    write_atomic(path, "".join(json_line(updates.get(i, record)) for i, record in records.items()))


def check_batch_size(size: Any) -> int:
    """`size` if get_batch_size() may return it, else an EvaluationError (the grader's contract)."""
    problem = batch_size_problem(size)
    if problem:
        raise EvaluationError(problem)
    return size


def checked_answers(answers: Any, count: int, timed_out: bool) -> list[str]:
    """The answers of a batch of `count` queries as recorded: "i don't know" for each when it timed out, else the
    model's own, which must be a list of `count` strings (an EvaluationError otherwise), cleaned as data text is."""
    if timed_out:
        return [IDK] * count
    if not isinstance(answers, list) or len(answers) != count or not all(isinstance(a, str) for a in answers):
        raise EvaluationError(f"batch_generate_answer returned {type(answers).__name__} "
                              f"for {count} queries; it must return a list of {count} strings")
    return [clean_text(answer) for answer in answers]  # no lone surrogate reaches the judge's tokenizer


def take(examples: Iterator[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The next batch: up to `count` examples (fewer at the end, none when there are none left)."""
    return [example for _, example in zip(range(count), examples)]


@runtime_checkable
class StoppableModel(Protocol):
    """A model that runs each batch where it can be stopped at its time limit (evaluation.worker.ModelWorker: a
    child process)."""

    def call_with_limit(self, batch: dict[str, list[Any]],
                        limit_s: float | None) -> tuple[BatchResult | None, float, bool]: ...


def call_with_limit(model: Any, batch: dict[str, list[Any]], limit_s: float | None, wait_late: bool = True,
                    clock: Callable[[], float] = time.monotonic) -> tuple[BatchResult | None, float, bool]:
    """(result, seconds, timed_out) of the model's answers to `batch` (utils.batch.answer_batch: the answers and
    the trace), run in a worker thread.

    Answers that come past `limit_s` by `clock` count as timed out, as the grader would count them. A thread cannot
    be stopped, so the call is still awaited before the next batch starts (the model is not safe to call twice at
    once); with `wait_late` False it is not, and the result is None: the caller ends the process instead (a Ray
    replica). An exception of the call, KeyboardInterrupt included, is raised here. A model that offers its own
    `call_with_limit` (evaluation.worker.ModelWorker: a child process it can stop) is asked to do it.
    """
    if isinstance(model, StoppableModel):
        return model.call_with_limit(batch, limit_s)
    deadline = Deadline(limit_s, clock) if limit_s is not None else None
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["result"] = answer_batch(model, batch)
        except BaseException as err:  # re-raised in the caller's thread below
            outcome["error"] = err
        outcome["late"] = deadline is not None and deadline.expired()  # when the answers came, not when looked at

    started = clock()
    worker = threading.Thread(target=call, name="answer_batch", daemon=True)
    worker.start()
    if deadline is None:
        worker.join()
    else:  # looked at every LOOK_S: the deadline holds by `clock`, which need not keep the pace of a sleep
        while worker.is_alive() and not deadline.expired():
            worker.join(min(deadline.remaining(), LOOK_S))
    timed_out = worker.is_alive() or outcome.get("late", False)
    if timed_out:
        logger.warning("batch of {} exceeded its {:.0f} s limit; its answers count as timed out",
                       len(batch.get("query", [])), limit_s)
        if not wait_late:
            return None, clock() - started, True
        worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result"), clock() - started, timed_out


class PredictionLog:
    """A run folder's predictions.jsonl: the records of an earlier run loaded, those answered now appended per batch
    (flushed and synced, so an interrupted run resumes), and the progress bar over the questions left."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.done = load_predictions(path)
        self._order: list[str] = []
        self._out: IO[str] | None = None
        self._counted: dict[str, int] = {}
        self.bar: tqdm | None = None

    def pending(self, examples: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The examples without a final record yet (none, or one whose LLM calls or stages failed: answered again,
        its new line read after the old one); every example read is kept in the order records() returns."""
        for example in examples:
            self._order.append(example["interaction_id"])
            done = self.done.get(example["interaction_id"])
            if done is None or Record(done).failures:
                yield example

    def records(self) -> list[dict[str, Any]]:
        """The record of every example read by pending(), in its order (each question once)."""
        return [self.done[i] for i in dict.fromkeys(self._order)]

    @contextlib.contextmanager
    def appending(self, total: int | None = None,
                  count: Callable[[Collection[str]], int] | None = None) -> Iterator[PredictionLog]:
        """The file open for add(), with a progress bar (on a terminal) of the questions answered now against
        `total`, the number still to answer; `count(answered ids)` gives it instead, counted in a thread beside the
        run (a large file takes a while)."""
        final = frozenset(i for i, record in self.done.items() if not Record(record).failures)
        self._counted = _count_beside(count, final) if count is not None and total is None else {}
        with open_text(self.path, "a") as self._out, \
                tqdm(total=total or self._counted.get("total"), unit="q", desc="answering", disable=None,
                     smoothing=0.1, dynamic_ncols=True) as self.bar:
            if self.done:
                self.bar.set_postfix_str(f"{len(self.done)} already in {self.path.name}", refresh=False)
            try:
                yield self
            finally:
                self._out, self.bar = None, None

    def add(self, batch: list[dict[str, Any]], answers: list[str], seconds: float, timed_out: bool,
            traces: Iterable[dict[str, Any]] | None) -> None:
        """Append the records of one answered batch (`traces`: the model's trace records, by interaction_id)."""
        assert self._out is not None and self.bar is not None, "add() belongs inside appending()"
        by_id = {t.get("interaction_id"): t for t in traces or []}
        records = {example["interaction_id"]: prediction_record(example, answer, seconds, len(batch), timed_out,
                                                                by_id.get(example["interaction_id"]))
                   for example, answer in zip(batch, answers, strict=True)}
        append_lines(self._out, [json_line(record) for record in records.values()])  # the batch whole, or none
        self.done.update(records)
        if self.bar.total is None and "total" in self._counted:
            self.bar.total = self._counted["total"]
        self.bar.update(len(batch))


def prediction_record(example: dict[str, Any], answer: str, seconds: float, batch_size: int, timed_out: bool,
                      trace: dict[str, Any] | None) -> dict[str, Any]:
    """A question's line of predictions.jsonl: its example's fields, the answer, its batch's seconds and size,
    whether the batch ran over its limit, and the model's trace record."""
    record = {key: example.get(key) for key in RECORD_FIELDS}
    record.update(prediction=answer, batch_seconds=round(seconds, 3), batch_size=batch_size, timed_out=timed_out,
                  trace=trace)
    return record


def run_model(model: Any, examples: Iterable[dict[str, Any]], predictions_path: Path,
              total: int | None = None, per_query_s: float | None = 30.0,
              count: Callable[[Collection[str]], int] | None = None,
              clock: Callable[[], float] = time.monotonic) -> list[dict[str, Any]]:
    """Records for every example, in order: loaded from an earlier run where present, else predicted now.

    A batch gets batch size x `per_query_s` seconds by `clock` (None: no limit); the queries of a batch over it
    are recorded with `timed_out` and the answer "i don't know", whatever the model returned late.
    `total` and `count`: the progress bar's, as PredictionLog.appending takes them.
    """
    log = PredictionLog(predictions_path)
    queue = log.pending(examples)
    first = next(queue, None)  # the model is asked for nothing (and need not load) when every answer is there
    if first is None:
        return log.records()
    queue = itertools.chain([first], queue)
    with log.appending(total, count):
        while batch := take(queue, check_batch_size(model.get_batch_size())):
            limit = len(batch) * per_query_s if per_query_s else None
            result, seconds, timed_out = call_with_limit(model, make_batch(batch), limit, clock=clock)
            answers = checked_answers(result.answers if result else None, len(batch), timed_out)
            log.add(batch, answers, seconds, timed_out, result.trace if result else [])
    return log.records()


def _count_beside(count: Callable[[Collection[str]], int], answered: frozenset[str]) -> dict[str, int]:
    """{"total": count(answered)} once a daemon thread has counted (at once when it takes under half a second);
    a count that fails leaves the bar without a total, and the reader of the run reports the error."""
    counted: dict[str, int] = {}

    def work() -> None:
        try:
            counted["total"] = count(answered)
        except Exception as err:  # noqa: BLE001 - the run's own reading of the file raises it where it matters
            logger.debug("no total for the progress bar: {}: {}", type(err).__name__, err)

    thread = threading.Thread(target=work, name="count-questions", daemon=True)
    thread.start()
    thread.join(0.5)
    return counted
