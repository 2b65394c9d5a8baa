"""Runs a UserModel over examples batch by batch; predictions are appended per batch so a re-run resumes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from loguru import logger
from tqdm import tqdm

from evaluation.data import MODEL_FIELDS
from models.config import MAX_BATCH_SIZE

RECORD_FIELDS = ("interaction_id", "query", "answer", "alt_answers", "domain", "question_type", "static_or_dynamic",
                 "popularity")


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


def _batch_size(model: Any) -> int:
    size = model.get_batch_size()
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_BATCH_SIZE:
        raise EvaluationError(f"get_batch_size() returned {size!r}; the grader accepts an int in 1..{MAX_BATCH_SIZE}")
    return size


def _take(examples: Iterator[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    return [example for _, example in zip(range(count), examples)]


def run_model(model: Any, examples: Iterable[dict[str, Any]], predictions_path: Path,
              total: int | None = None) -> list[dict[str, Any]]:
    """Records for every example, in order: loaded from an earlier run where present, else predicted now."""
    predictions_path.parent.mkdir(parents=True, exist_ok=True)
    done = load_predictions(predictions_path)
    order: list[str] = []

    def pending() -> Iterator[dict[str, Any]]:
        for example in examples:
            order.append(example["interaction_id"])
            if example["interaction_id"] not in done:
                yield example

    queue = pending()
    with predictions_path.open("a", encoding="utf-8") as out, tqdm(total=total, unit="q", desc="evaluating") as bar:
        while batch := _take(queue, _batch_size(model)):
            started = time.perf_counter()
            answers = model.batch_generate_answer({key: [e[key] for e in batch] for key in MODEL_FIELDS})
            seconds = time.perf_counter() - started
            if not isinstance(answers, list) or len(answers) != len(batch) or not all(isinstance(a, str) for a in answers):
                raise EvaluationError(f"batch_generate_answer returned {type(answers).__name__} "
                                      f"for {len(batch)} queries; it must return a list of {len(batch)} strings")
            traces = {t.get("interaction_id"): t for t in getattr(model, "last_batch_trace", []) or []}
            for example, answer in zip(batch, answers):
                record = {key: example.get(key) for key in RECORD_FIELDS}
                record.update(prediction=answer, batch_seconds=round(seconds, 3), batch_size=len(batch),
                              trace=traces.get(example["interaction_id"]))
                done[example["interaction_id"]] = record
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
            bar.update(len(batch))
    return [done[i] for i in dict.fromkeys(order)]
