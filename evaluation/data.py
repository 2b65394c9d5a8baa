"""CRAG examples from .jsonl / .jsonl.bz2, streamed line by line; malformed lines reported and skipped."""

from __future__ import annotations

import ast
import bz2
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from loguru import logger

MODEL_FIELDS = ("interaction_id", "query", "search_results", "query_time")


class DataError(ValueError):
    """A data file that cannot be read at all; the message names the file."""


@dataclass
class ReadStats:
    skipped_lines: list[int] = field(default_factory=list)


def check_data_file(path: Path) -> None:
    """Raise DataError unless `path` is a data file this module reads."""
    if not path.is_file():
        raise DataError(f"{path}: no such data file (give a CRAG .jsonl or .jsonl.bz2 file)")
    if path.suffix not in (".bz2", ".jsonl", ".json"):
        raise DataError(f"{path}: unsupported data file type (give a .jsonl or .jsonl.bz2 file)")


def _open(path: Path) -> TextIO:
    check_data_file(path)
    if path.suffix == ".bz2":
        return bz2.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def alternative_answers(example: dict[str, Any]) -> list[str]:
    """`alt_ans` or `alternative_answers`, as a list or as the JSON / Python list string CRAG ships."""
    raw = example.get("alternative_answers", example.get("alt_ans", []))
    if isinstance(raw, str):
        for parse in (json.loads, ast.literal_eval):
            try:
                raw = parse(raw)
                break
            except (ValueError, SyntaxError):
                continue
        else:
            raw = [raw] if raw.strip() else []
    return [str(a) for a in raw] if isinstance(raw, list) else []


def read_examples(path: Path, stats: ReadStats | None = None, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Examples with `alt_answers` normalised; lines that are not a usable example are logged and skipped."""
    stats = stats or ReadStats()
    count = 0
    with _open(path) as handle:
        for number, line in enumerate(handle, start=1):
            if limit is not None and count >= limit:
                return
            if not line.strip():
                continue
            try:
                example = json.loads(line)
                missing = [k for k in (*MODEL_FIELDS, "answer") if k not in example]
                if missing:
                    raise ValueError(f"missing {missing}")
            except (json.JSONDecodeError, ValueError, TypeError) as err:
                logger.warning("{}:{}: skipped malformed example ({})", path, number, err)
                stats.skipped_lines.append(number)
                continue
            example["alt_answers"] = alternative_answers(example)
            count += 1
            yield example
