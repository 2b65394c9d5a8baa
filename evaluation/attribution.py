"""Error attribution: for each answer that is not correct, where the gold answer was lost.

A gold answer (the answer or an alternative) is looked for as text, after `evidence_form` (case folded,
accents dropped, thousands separators and currency signs removed, other punctuation read as a space), as whole
words. Classes, first match wins:

- declined: the pipeline did not try: the batch timed out, or the query was answered "i don't know" before any
  evidence was chosen for it (the dynamic pre-check);
- generation: the gold answer was in what the reasoning prompt got (a chosen reference, a KG line, a
  calculator line) and the answer did not carry it;
- retrieval: a page of the question holds it (its text, tables or snippet), no chosen reference does;
- kg: the KG stage ran for the question and no KG line holds it (and no page does);
- pages: no page holds it, and the KG did not run for the question;
- unattributable: a gold answer that cannot be found as text: yes/no, "invalid question", or a number that no
  page holds (it may be computed).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evaluation.data import read_examples
from evaluation.record import Record, as_record, records_of
from evaluation.verdicts import MISS, WRONG
from utils.answers import is_invalid
from utils.cache import cache_root
from utils.web_pages import PageProcessor, PageSettings

CLASSES = ("generation", "retrieval", "kg", "pages", "declined", "unattributable")
_YES_NO = {"yes", "no", "true", "false"}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_CURRENCY = re.compile(r"[$€£¥]")
_PUNCT = re.compile(r"[^\w.%]+|(?<!\d)\.|\.(?!\d)")
_NUMBER = re.compile(r"^[\d.% ]+$")


def evidence_form(text: str) -> str:
    """`text` folded for finding an answer in evidence: "$1,234.50 (USD)" -> "1234.50 usd"."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode()
    text = _CURRENCY.sub(" ", _THOUSANDS.sub("", text.lower()))
    return " ".join(_PUNCT.sub(" ", text).split())


def holds(texts: Iterable[str], golds: list[str]) -> bool:
    """Whether any text holds any gold answer (both in evidence form) as whole words."""
    haystack = " | ".join(evidence_form(t) for t in texts)
    return any(re.search(rf"(?<![\w.]){re.escape(g)}(?![\w])", haystack) for g in golds)


def gold_answers(line: Record | dict[str, Any]) -> list[str]:
    """The record's gold answers that can be found as text, in evidence form ([] when none can)."""
    forms = [evidence_form(a) for a in as_record(line).golds if isinstance(a, str) and not is_invalid(a)]
    return [f for f in dict.fromkeys(forms) if f and f not in _YES_NO]


def attribute(line: Record | dict[str, Any], page_texts: list[str] | None) -> str:
    """The class of one missed question; `page_texts` is the text of its pages (None when they were not read)."""
    record = as_record(line)
    golds = gold_answers(record)
    if not golds:
        return "unattributable"
    prompt = [r.get("text", "") for r in record.references] + [str(line) for _, lines in record.evidence()
                                                                for line in lines]
    if record.timed_out or (not prompt and str(record.reason or "").startswith("predicted ")):
        return "declined"
    if holds(prompt, golds):
        return "generation"
    in_pages = page_texts is not None and holds(page_texts, golds)
    if in_pages:
        return "retrieval"
    if any(stage.get("stage") == "kg" and stage.get("status") == "ok" for stage in record.stages):
        return "kg"
    if all(_NUMBER.match(g) for g in golds):
        return "unattributable"
    return "pages"


def attribute_records(lines: list[dict[str, Any]], pages_of: Callable[[list[str]], dict[str, list[str]]]) -> None:
    """Set "attribution" on every record whose verdict is not correct (and None on the others). `pages_of`
    gives the page texts of the questions by interaction_id, asked once for all the misses."""
    records = records_of(lines)
    missed = [r for r in records if r.verdict in (MISS, WRONG)]  # unjudged answers are not known misses
    texts = pages_of([r.interaction_id or "" for r in missed]) if missed else {}  # "": no pages to read
    for record in records:
        record.attribution = None
    for record in missed:
        record.attribution = attribute(record, texts.get(record.interaction_id or ""))


def attribution_table(lines: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Counts of each class, overall and by domain: {"overall": {class: n}, "<domain>": {...}}."""
    table: dict[str, Counter] = defaultdict(Counter)
    for record in records_of(lines):
        if record.attribution:
            table["overall"][record.attribution] += 1
            table[str(record.domain or "unknown")][record.attribution] += 1
    return {group: {c: counts[c] for c in CLASSES} for group, counts in table.items()}


def page_texts(data: Path, ids: list[str], references: Any, timeout_s: float = 600.0) -> dict[str, list[str]]:
    """The text of each listed question's pages (chunks, tables and snippets), processed as the references stage
    processes them (`references` is the config's section) and through the same page cache, so pages the run
    already parsed are read back, not parsed again."""
    wanted = set(ids)
    examples = [e for e in read_examples(data, quiet=True) if e["interaction_id"] in wanted]  # the run named them
    cache = cache_root(references.cache_dir) / "pages" if references.cache else None
    processor = PageProcessor(PageSettings.from_config(references), 1, cache)  # in this process: nothing forks
    try:
        texts = {}
        for example in tqdm(examples, desc="attribution: pages", unit="q", disable=len(examples) < 20):
            pages = example["search_results"]  # a list of objects: evaluation/data.py read it
            done = processor.process([(p.get("page_result"), str(p.get("page_name") or "")) for p in pages],
                                     timeout_s)
            texts[example["interaction_id"]] = [str(p.get("page_snippet") or "") for p in pages] + [
                text for page in done if page is not None for text in (*page.chunks, *page.tables)]
        return texts
    finally:
        processor.close()
