"""Runs a UserModel over examples batch by batch; predictions are appended per batch so a re-run resumes."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

from loguru import logger
from tqdm import tqdm

from models.config import MAX_BATCH_SIZE
from utils.answers import IDK
from utils.batch import make_batch

RECORD_FIELDS = ("interaction_id", "query", "answer", "alt_answers", "domain", "question_type", "static_or_dynamic",
                 "popularity", "split")


class EvaluationError(RuntimeError):
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
    for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
            records[record["interaction_id"]] = record
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise EvaluationError(f"{path}:{number}: unreadable prediction ({err}); delete the file or use --restart") from err
    return records


def save_judgements(path: Path, judged: list[dict[str, Any]]) -> None:
    """Write the judged records (verdicts, the judge's reasons, attribution) over their lines of `path`; the
    lines of other questions stay as they are. The file is replaced at once, so a crash leaves the old one."""
    updates = {r["interaction_id"]: r for r in judged}
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as out:
        for interaction_id, record in load_predictions(path).items():
            out.write(json.dumps(updates.get(interaction_id, record), ensure_ascii=False) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


def _batch_size(model: Any) -> int:
    size = model.get_batch_size()
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_BATCH_SIZE:
        raise EvaluationError(f"get_batch_size() returned {size!r}; the grader accepts an int in 1..{MAX_BATCH_SIZE}")
    return size


def _take(examples: Iterator[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    return [example for _, example in zip(range(count), examples)]


def call_with_limit(model: Any, batch: dict[str, list[Any]], limit_s: float | None) -> tuple[Any, float, bool]:
    """(answers, seconds, timed_out) of model.batch_generate_answer(batch), run in a worker thread.

    Past `limit_s` the batch counts as timed out, as the grader would count it. A thread cannot be stopped,
    so the call is still awaited before the next batch starts (the model is not safe to call twice at once).
    An exception of the call, KeyboardInterrupt included, is raised here. A model that offers its own
    `call_with_limit` (evaluation.worker.ModelWorker: a child process it can stop) is asked to do it.
    """
    if hasattr(model, "call_with_limit"):
        return model.call_with_limit(batch, limit_s)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["answers"] = model.batch_generate_answer(batch)
        except BaseException as err:  # re-raised in the caller's thread below
            outcome["error"] = err

    started = time.perf_counter()
    worker = threading.Thread(target=call, name="batch_generate_answer", daemon=True)
    worker.start()
    worker.join(limit_s)
    timed_out = worker.is_alive()
    if timed_out:
        logger.warning("batch of {} exceeded its {:.0f} s limit; its answers count as timed out",
                       len(batch.get("query", [])), limit_s)
        worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("answers"), time.perf_counter() - started, timed_out


def run_model(model: Any, examples: Iterable[dict[str, Any]], predictions_path: Path,
              total: int | None = None, per_query_s: float | None = 30.0,
              count: Callable[[Collection[str]], int] | None = None) -> list[dict[str, Any]]:
    """Records for every example, in order: loaded from an earlier run where present, else predicted now.

    A batch gets batch size x `per_query_s` seconds (None: no limit); the queries of a batch over it are
    recorded with `timed_out` and the answer "i don't know", whatever the model returned late.
    The progress bar (on a terminal) counts the questions answered now against `total`, the number still to
    answer; `count(answered ids)` gives it instead, counted in a thread beside the run (a large file takes a while).
    """
    predictions_path.parent.mkdir(parents=True, exist_ok=True)
    done = load_predictions(predictions_path)
    order: list[str] = []

    def pending() -> Iterator[dict[str, Any]]:
        for example in examples:
            order.append(example["interaction_id"])
            if example["interaction_id"] not in done:
                yield example

    queue = pending()
    first = next(queue, None)  # the model is asked for nothing (and need not load) when every answer is there
    if first is None:
        return [done[i] for i in dict.fromkeys(order)]
    queue = itertools.chain([first], queue)
    counted = _count_beside(count, frozenset(done)) if count is not None and total is None else {}
    with predictions_path.open("a", encoding="utf-8") as out, \
            tqdm(total=total or counted.get("total"), unit="q", desc="answering", disable=None, smoothing=0.1,
                 dynamic_ncols=True) as bar:
        if done:
            bar.set_postfix_str(f"{len(done)} already in {predictions_path.name}", refresh=False)
        while batch := _take(queue, _batch_size(model)):
            limit = len(batch) * per_query_s if per_query_s else None
            answers, seconds, timed_out = call_with_limit(model, make_batch(batch),
                                                          limit)
            if timed_out:
                answers = [IDK] * len(batch)
            elif not isinstance(answers, list) or len(answers) != len(batch) or not all(isinstance(a, str) for a in answers):
                raise EvaluationError(f"batch_generate_answer returned {type(answers).__name__} "
                                      f"for {len(batch)} queries; it must return a list of {len(batch)} strings")
            traces = {t.get("interaction_id"): t for t in getattr(model, "last_batch_trace", []) or []}
            for example, answer in zip(batch, answers):
                record = {key: example.get(key) for key in RECORD_FIELDS}
                record.update(prediction=answer, batch_seconds=round(seconds, 3),
                              batch_size=len(batch), timed_out=timed_out, trace=traces.get(example["interaction_id"]))
                done[example["interaction_id"]] = record
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
            if bar.total is None and "total" in counted:
                bar.total = counted["total"]
            bar.update(len(batch))
    return [done[i] for i in dict.fromkeys(order)]


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
