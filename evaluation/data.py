"""CRAG examples from .jsonl / .jsonl.bz2, streamed line by line; malformed lines reported and skipped."""

from __future__ import annotations

import ast
import bz2
import glob
import io
import json
import random
import re
import tarfile
from collections.abc import Callable, Collection, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from utils.batch import BATCH_FIELDS, id_text
from utils.errors import ConfigError, HarnessError
from utils.html import clean_text
from utils.names import did_you_mean


class DataError(HarnessError, ValueError):
    """A data file that cannot be read at all; the message names the file."""


TASK3_PAGES = 50  # Task 3 gives 50 pages a question, Tasks 1 and 2 give 5


def task3_set(questions: list[dict[str, Any]], pool: list[dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """Each question with its own pages padded to TASK3_PAGES from `pool` (pages of other questions, never one
    of its own by URL), all in a seeded random order: Task-3-sized questions from Task-1 data."""
    rng = random.Random(seed)
    padded = []
    for question in questions:
        own = question["search_results"][:TASK3_PAGES]
        urls = {page.get("page_url") for page in own}
        others = [page for page in pool if page.get("page_url") not in urls]
        pages = own + rng.sample(others, min(len(others), TASK3_PAGES - len(own)))
        rng.shuffle(pages)
        padded.append({**question, "search_results": pages})
    return padded


def task3_pool(sets: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The pages a Task-3 question is padded from: those of the real questions and of gate_dev."""
    return [page for name in ("real", "gate_dev") for e in sets.get(name, []) for page in e["search_results"]]

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
    dynamism: frozenset[str] = frozenset()

    def keeps(self, example: dict[str, Any]) -> bool:
        """Whether the filters (not the shard or the limit) keep `example`."""
        return ((not self.domains or example.get("domain") in self.domains)
                and (not self.question_types or example.get("question_type") in self.question_types)
                and (not self.dynamism or example.get("static_or_dynamic") in self.dynamism)
                and (self.split is None or example.get("split") == self.split))


# CRAG's question types (its domains and dynamism classes are models.config's DOMAINS and DYNAMISM).
QUESTION_TYPES = ("simple", "simple_w_condition", "set", "comparison", "aggregation", "multi-hop", "post-processing",
                  "false_premise")


def parse_choices(flag: str, text: str, allowed: tuple[str, ...]) -> frozenset[str]:
    """The comma-separated values of `flag`; a ConfigError naming a value CRAG does not have, with the closest one."""
    values = frozenset(v.strip() for v in text.split(",") if v.strip())
    for value in sorted(values - set(allowed)):
        raise ConfigError(f"{flag} {value!r} is not a CRAG value{did_you_mean(value, allowed)}")
    return values


def parse_shard(text: str) -> tuple[int, int]:
    """"i/n" -> (i, n) with 1 <= i <= n; a ConfigError naming the input otherwise."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard {text!r}: write it as i/n, e.g. 2/4") from None
    if not 1 <= index <= count:
        raise ConfigError(f"--shard {text!r}: i must be between 1 and n")
    return index, count


SUPPORTED = "a CRAG .jsonl, .jsonl.bz2 or Task 3 .tar.bz2 file (or the first of its .tar.bz2.partN pieces)"


def _parts(path: Path) -> list[Path]:
    """The pieces of a split archive, in order, when `path` names one piece or their common stem."""
    stem = re.sub(r"\.part\d+$", "", path.name)
    pieces = sorted(
        path.parent.glob(f"{glob.escape(stem)}.part*"), key=lambda p: int(re.findall(r"\d+$", p.name)[0] or 0)
    )
    return [p for p in pieces if re.search(r"\.part\d+$", p.name)]


def _is_tar(path: Path) -> bool:
    return ".tar" in "".join(Path(re.sub(r"\.part\d+$", "", path.name)).suffixes)


FIRST_RECORDS = 100  # check_data_file(examples=True) looks this far for a CRAG example


def check_data_file(path: Path, examples: bool = False) -> None:
    """Raise DataError unless `path` is a data file this module reads. With `examples`, its start is read too: a
    file that cannot be decompressed, holds no record, or none of whose first FIRST_RECORDS records is a CRAG example
    (the first bad one is named with its line number) is a DataError as well, before any work starts. A bad record
    after a good one is only skipped when the examples are read (read_examples logs it)."""
    if path.is_dir():
        raise DataError(f"{path}: a folder, not a data file (give {SUPPORTED})")
    if not path.is_file() and not (_is_tar(path) and _parts(path)):
        raise DataError(f"{path}: no such data file (give {SUPPORTED})")
    if not (_is_tar(path) or path.suffix in (".bz2", ".jsonl", ".json")):
        raise DataError(f"{path}: unsupported data file type (give {SUPPORTED})")
    if not examples:
        return
    first_bad, records = None, 0
    lines = data_lines(path)
    try:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            problem = _parse_example(line)[1]
            if problem is None:
                return
            first_bad, records = first_bad or f"{path}:{number}: not a CRAG example ({problem})", records + 1
            if records >= FIRST_RECORDS:
                break
    finally:
        lines.close()
    if first_bad is None:
        raise DataError(f"{path}: no examples (the file is empty); give {SUPPORTED}")
    others = f", nor is any of its first {records} records" if records > 1 else ""
    raise DataError(f"{first_bad}{others}; give {SUPPORTED}")


class _Undecodable(str):
    """A line of a data file that is not UTF-8, standing in its place (so later lines keep their numbers); its
    text is why."""


# A JSON escape that may decode to a lone surrogate or a control character (utils/html.py clean_text); a line
# without one decodes to strings that any UTF-8 writer takes, and is not walked.
_ESCAPED_UNWRITABLE = re.compile(r"\\u(?:[dD][89a-fA-F]|00[01])")


def _cleaned(value: Any) -> Any:
    """`value` with clean_text applied to every string in it (keys included)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    if isinstance(value, dict):
        return {clean_text(k): _cleaned(v) for k, v in value.items()}
    return value


def _parse_example(line: str) -> tuple[dict[str, Any] | None, str | None, list[str]]:
    """(the example, None, notes) of one line of a data file, or (None, why it is not a usable CRAG example, []).

    Every reader of examples sees the same shape: `interaction_id` a non-empty string (an integer is read as its
    digits), `query` a non-empty string, `query_time` a string, `search_results` a list of page objects (anything
    else is read as no pages, and a non-object entry is dropped; `notes` says so), and no string holds a lone
    surrogate or a control character (the cleaning pages get)."""
    if isinstance(line, _Undecodable):
        return None, str(line), []
    try:
        example = json.loads(line)
    except json.JSONDecodeError as err:
        return None, f"not JSON: {err}", []
    except RecursionError:
        return None, "not JSON: nested too deep", []
    if not isinstance(example, dict):
        return None, f"a JSON {type(example).__name__}, not an object", []
    missing = [k for k in (*BATCH_FIELDS, "answer") if k not in example]
    if missing:
        return None, f"missing {missing}", []
    if _ESCAPED_UNWRITABLE.search(line):
        example = _cleaned(example)
    identifier = id_text(example["interaction_id"])
    if identifier is None or not identifier.strip():
        return None, f"interaction_id is {_shown(example['interaction_id'])}, not a non-empty string", []
    example["interaction_id"] = identifier
    if not isinstance(example["query"], str) or not example["query"].strip():
        return None, f"query is {_shown(example['query'])}, not a non-empty string", []
    if not isinstance(example["query_time"], str):
        return None, f"query_time is {_shown(example['query_time'])}, not a string", []
    notes: list[str] = []
    pages = example["search_results"]
    if not isinstance(pages, list):
        notes.append(f"search_results is {_shown(pages)}, not a list; read as no pages")
        pages = []
    kept = [page for page in pages if isinstance(page, dict)]
    if len(kept) < len(pages):
        notes.append(f"{len(pages) - len(kept)} of {len(pages)} search_results are not objects; dropped")
    example["search_results"] = kept
    return example, None, notes


def _shown(value: Any) -> str:
    """A value's type and a short view of it, for a message."""
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}" if value is not None else "null"


class _Concatenated(io.RawIOBase):
    """The bytes of several files, one after another, read sequentially (split archives)."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths = iter(paths)
        self._handle: io.BufferedReader | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while True:
            if self._handle is None:
                following = next(self._paths, None)
                if following is None:
                    return 0
                self._handle = following.open("rb")
            count = self._handle.readinto(buffer)
            if count:
                return count
            self._handle.close()
            self._handle = None


def data_pieces(path: Path) -> list[Path]:
    """The files a data path stands for: itself, or every piece of a split archive it names."""
    return _parts(path) if re.search(r"\.part\d+$", path.name) or not path.is_file() else [path]


def _tar_lines(path: Path) -> Iterator[bytes]:
    """Lines of every .jsonl member of a (possibly split) .tar.bz2, streamed: the archive is never unpacked."""
    pieces = data_pieces(path)
    stream = io.BufferedReader(_Concatenated(pieces), buffer_size=1 << 20)
    with tarfile.open(fileobj=stream, mode="r|*") as archive:
        for member in archive:
            if member.isfile() and member.name.endswith((".jsonl", ".json")):
                handle = archive.extractfile(member)
                if handle is not None:
                    yield from handle


def _raw_lines(path: Path) -> Iterator[bytes]:
    if _is_tar(path):
        yield from _tar_lines(path)
        return
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rb") as handle:
        yield from handle


def _decoded(raw: bytes) -> str:
    """A line's text; a line that is not UTF-8 becomes an _Undecodable naming the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return _Undecodable(f"not UTF-8: byte 0x{raw[err.start]:02x} at column {err.start + 1}")


def data_lines(path: Path) -> Generator[str, None, None]:
    """The lines of a data file (.jsonl, .jsonl.bz2, a Task 3 archive), each decoded alone: a line that is not UTF-8
    costs that line only (an _Undecodable stands in its place). A corrupt or truncated file (bz2, tar) is a
    DataError naming the last good line."""
    check_data_file(path)
    number = 0
    try:
        for number, raw in enumerate(_raw_lines(path), start=1):  # noqa: B007 - the except below names it
            yield _decoded(raw)
    except (OSError, EOFError, tarfile.TarError) as err:
        where = f" after line {number}" if number else ""
        raise DataError(f"{path}: unreadable{where} ({type(err).__name__}: {err}); is it a complete, uncorrupted "
                        f"copy? (give {SUPPORTED})") from None


def first_record(path: Path) -> dict[str, Any] | None:
    """The first non-empty line of a data file as JSON, or None when it is not a JSON object."""
    for line in data_lines(path):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                return None
            return record if isinstance(record, dict) else None
    return None


def is_crag_format(path: Path, other: str) -> bool:
    """Whether a training tool's data file is CRAG-format (questions with pages) rather than its own .jsonl of
    `other` (named in the error for a compressed file that is not CRAG)."""
    first = first_record(path)
    if first is None:
        raise DataError(f"{path}: the first line is not a JSON object")
    if "search_results" not in first and not path.name.endswith(".jsonl"):
        raise DataError(f"{path}: {other} must be a plain .jsonl file")
    return "search_results" in first


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
                  selection: Selection | None = None, quiet: bool = False) -> Iterator[dict[str, Any]]:
    """Examples with `alt_answers` normalised, as `selection` (or `limit`) chooses; lines that are not a usable
    example, and a repeated interaction_id's later lines, are logged (unless `quiet`) and skipped."""
    stats = stats or ReadStats()

    def skipped(number: int, problem: str) -> None:
        if not quiet:
            logger.warning("{}:{}: skipped malformed example ({})", path, number, problem)
        stats.skipped_lines.append(number)

    def noted(number: int, note: str) -> None:
        if not quiet:
            logger.warning("{}:{}: {}", path, number, note)

    yield from _selected(path, selection or Selection(limit=limit), skipped, noted)


def count_examples(path: Path, selection: Selection, answered: Collection[str] = ()) -> int:
    """How many examples read_examples(path, selection=selection) gives whose interaction_id is not in `answered`
    (a progress bar's total, counted beside the run: it logs nothing)."""
    return sum(e["interaction_id"] not in answered for e in read_examples(path, selection=selection, quiet=True))


def _selected(path: Path, selection: Selection, skipped: Callable[[int, str], None],
              noted: Callable[[int, str], None]) -> Iterator[dict[str, Any]]:
    count = kept = 0
    first_line: dict[str, int] = {}  # interaction_id -> the line that gave it: a question is answered once
    lines = data_lines(path)
    try:
        for number, line in enumerate(lines, start=1):
            if selection.limit is not None and count >= selection.limit:
                return
            if not line.strip():
                continue
            example, problem, notes = _parse_example(line)
            if example is None:
                skipped(number, str(problem))
                continue
            identifier = example["interaction_id"]
            if identifier in first_line:
                skipped(number, f"interaction_id {identifier!r} repeats line {first_line[identifier]}, which is kept")
                continue
            first_line[identifier] = number
            for note in notes:
                noted(number, note)
            if not selection.keeps(example):
                continue
            kept += 1
            if (kept - 1) % selection.shard_count != selection.shard_index - 1:
                continue
            example["alt_answers"] = alternative_answers(example)
            count += 1
            yield example
    finally:
        lines.close()  # closes the file even when the limit stops early
