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


@dataclass(frozen=True)
class Selection:
    """Which examples a run takes: filters on CRAG fields, then shard `index` of `count` (1-based), then a
    limit. Shards split by position among the examples the filters keep, so shards of one selection cover
    it exactly once."""

    domains: frozenset[str] = frozenset()
    question_types: frozenset[str] = frozenset()
    split: int | None = None
    shard_index: int = 1
    shard_count: int = 1
    limit: int | None = None

    def keeps(self, example: dict[str, Any]) -> bool:
        return ((not self.domains or example.get("domain") in self.domains)
                and (not self.question_types or example.get("question_type") in self.question_types)
                and (self.split is None or example.get("split") == self.split))


def parse_shard(text: str) -> tuple[int, int]:
    """"i/n" -> (i, n) with 1 <= i <= n; ValueError naming the input otherwise."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: write it as i/n, e.g. 2/4") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text!r}: i must be between 1 and n")
    return index, count


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


def read_examples(path: Path, stats: ReadStats | None = None, limit: int | None = None,
                  selection: Selection | None = None) -> Iterator[dict[str, Any]]:
    """Examples with `alt_answers` normalised, as `selection` (or `limit`) chooses; lines that are not a usable
    example are logged and skipped."""
    stats = stats or ReadStats()
    selection = selection or Selection(limit=limit)
    count = kept = 0
    with _open(path) as handle:
        for number, line in enumerate(handle, start=1):
            if selection.limit is not None and count >= selection.limit:
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
            if not selection.keeps(example):
                continue
            kept += 1
            if (kept - 1) % selection.shard_count != selection.shard_index - 1:
                continue
            example["alt_answers"] = alternative_answers(example)
            count += 1
            yield example
