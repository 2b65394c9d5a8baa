"""Web page processing (the seed's section 4.1): one HTML page to text chunks and Markdown tables.

Each page is parsed with lxml. Boilerplate elements are removed and tables become Markdown and leave the tree;
the main text of what remains comes from resiliparse's main-content extraction (or trafilatura's, by setting),
falling back to every block's text when the extractor finds none, and the seed's chunking rules cut the text.
Why resiliparse reads the serialized tree rather than parsing the page on its own: docs/decisions/page-extractor.md.
`PageProcessor` runs pages in worker processes and caches results by content hash, so a page is never processed
twice, in one run or the next.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.pool
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import lxml.html
import trafilatura
from loguru import logger
from resiliparse.extract.html2text import extract_plain_text

from utils.cache import JsonCache, content_key
from utils.chunking import seed_chunks, split_sentences
from utils.html import block_text, lists_as_content, parse_html, remove_boilerplate, unescape_unicode
from utils.processes import die_with_parent
from utils.tables import extract_tables

POLL_S = 0.05  # how often a wait on the pool looks at the clock again; it bounds no page
PROCESSING_VERSION = "pages-1"  # bump when the output of process_html changes, to invalidate cached pages
EXTRACTORS = ("resiliparse", "trafilatura")


@dataclass(frozen=True)
class PageSettings:
    chunk_chars: int = 1000     # a question chunk collects answer text up to this length
    sentence_chars: int = 400   # longer sentences are truncated
    group_size: int = 3         # other sentences are grouped this many at a time
    table_chars: int = 4000     # one Markdown table (part) at most; longer tables are split between rows
    max_table_parts: int = 20   # per page
    max_page_chars: int = 2_000_000
    extractor: str = "resiliparse"  # one of EXTRACTORS; part of the fingerprint, so of every cache key

    def __post_init__(self) -> None:
        if self.extractor not in EXTRACTORS:
            raise ValueError(f"page extractor {self.extractor!r} is not one of {', '.join(EXTRACTORS)}")

    def fingerprint(self) -> str:
        return repr(sorted(asdict(self).items()))

    @classmethod
    def from_config(cls, config: Any) -> PageSettings:
        """The page-processing fields of a references config (any object with these attributes)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})


@dataclass
class ProcessedPage:
    chunks: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    source: str = "empty"  # where the main text came from: an extractor's name, "fallback" or "empty"


def extracted_text(tree: lxml.html.HtmlElement, extractor: str) -> str | None:
    """The extractor's main text of the cleaned tree, one block per line (None or blank: it found none)."""
    if extractor == "trafilatura":
        return trafilatura.extract(tree, fast=True, include_tables=False, include_comments=False,
                                   include_images=False, include_links=False)
    lists_as_content(tree)
    return extract_plain_text(lxml.html.tostring(tree, encoding="unicode"), preserve_formatting=True,
                              main_content=True, list_bullets=False, alt_texts=False)


def main_text(tree: lxml.html.HtmlElement, extractor: str) -> tuple[str, str]:
    """(text, source): the extractor's main text of the cleaned tree, else every block's text."""
    text = extracted_text(tree, extractor)
    if text and text.strip():
        return text, extractor
    text = block_text(tree)
    return text, "fallback" if text else "empty"


def process_html(raw: object, page_name: str, settings: PageSettings) -> ProcessedPage:
    """Chunks and tables of one page. Any input, even bytes that are not HTML, gives a page (maybe empty)."""
    tree = parse_html(raw, settings.max_page_chars)
    if tree is None:
        return ProcessedPage()
    remove_boilerplate(tree)
    tables = extract_tables(tree, page_name, settings.table_chars, settings.max_table_parts)
    text, source = main_text(tree, settings.extractor)
    sentences = split_sentences(unescape_unicode(text))
    chunks = seed_chunks(sentences, settings.sentence_chars, settings.chunk_chars, settings.group_size)
    return ProcessedPage(chunks, tables, source)


def _work(task: tuple[object, str, PageSettings]) -> ProcessedPage | str:
    """Worker side: the page, or the error's text for the parent to log (a bug must not kill the pool)."""
    try:
        return process_html(*task)
    except Exception as err:  # returned, logged by the parent with the page's name
        return f"{type(err).__name__}: {err}"


def _worker_start(parent_pid: int, forked_by_main_thread: bool) -> None:
    """A page worker ends with the process that made its pool, and leaves Ctrl-C to it (no traceback per worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid, forked_by_main_thread)


def _start_method() -> str:
    # fork starts workers in milliseconds and does not re-import the grader's main module; the pool is made
    # before any model loads, so the children hold no GPU state.
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class PageProcessor:
    """Processes pages in `workers` processes (1: in this process), with a content-addressed cache.

    `cache_folder` None keeps results in memory only; `use_cache` False processes every page every time, repeats
    within one call included (for benchmarks). `process`'s timeout is read on `clock`. Call `close()` to stop the
    workers. Why a forked pool polled on a clock: docs/decisions/page-pool.md.
    """

    def __init__(self, settings: PageSettings, workers: int = 0, cache_folder: Path | None = None,
                 use_cache: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.workers = workers if workers > 0 else (os.cpu_count() or 1)
        self.cache = JsonCache(cache_folder) if use_cache else None
        self._fingerprint = settings.fingerprint()
        self._pool: multiprocessing.pool.Pool | None = None
        if self.workers > 1:
            self._pool = self._new_pool()

    def _new_pool(self) -> multiprocessing.pool.Pool:
        # Forked workers inherit the parent's objects (a model process holds millions). Frozen, the workers' garbage
        # collector never scans them, which saves its time and keeps the pages of memory shared.
        gc.freeze()
        try:
            return multiprocessing.get_context(_start_method()).Pool(
                self.workers, _worker_start, (os.getpid(), threading.current_thread() is threading.main_thread()))
        finally:
            gc.unfreeze()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def process(self, pages: list[tuple[object, str]], timeout_s: float) -> list[ProcessedPage | None]:
        """One result per (html, page name), in order; None for a page not finished within timeout_s."""
        end = self.clock() + max(timeout_s, 0.0)
        if self.cache is None:  # no cache, no reuse: even a repeated page is processed again
            keys = [str(position) for position in range(len(pages))]
        else:
            keys = [content_key(PROCESSING_VERSION, self._fingerprint, name,
                                html if isinstance(html, (str, bytes)) else "") for html, name in pages]
        done: dict[str, ProcessedPage] = {}
        todo: dict[str, tuple[str | bytes, str, PageSettings]] = {}
        for key, (html, name) in zip(keys, pages):
            if key in done or key in todo:
                continue
            cached = self.cache.get(key) if self.cache is not None else None
            if cached is not None:
                done[key] = ProcessedPage(**cached)
            elif isinstance(html, (str, bytes)):
                todo[key] = (html, name, self.settings)
            else:
                done[key] = ProcessedPage()
        for key, result in self._run(todo, end).items():
            if isinstance(result, str):
                logger.error("page '{}' could not be processed: {}", todo[key][1], result)
                result = ProcessedPage()
            done[key] = result
            if self.cache is not None:
                self.cache.put(key, asdict(result))
        missing = sum(key not in done for key in keys)
        if missing:
            logger.warning("{} of {} pages not processed within {:.1f} s; answering without them",
                           missing, len(keys), timeout_s)
        return [done.get(key) for key in keys]

    def _run(
        self, todo: dict[str, tuple[str | bytes, str, PageSettings]], end: float
    ) -> dict[str, ProcessedPage | str]:
        if self._pool is None and self.workers > 1:
            self._pool = self._new_pool()
        if self._pool is None:  # in this process: no page can be interrupted, so check the clock between pages
            results: dict[str, ProcessedPage | str] = {}
            for key, task in todo.items():
                if self.clock() >= end:
                    break
                results[key] = _work(task)
            return results
        # Longest first (by HTML size), so that no big page starts last and leaves the other workers idle.
        ordered = sorted(todo.items(), key=lambda item: -len(item[1][0]))  # todo holds str or bytes pages only
        pending = {key: self._pool.apply_async(_work, (task,)) for key, task in ordered}
        results = {}
        while True:
            for key in [key for key, async_result in pending.items() if async_result.ready()]:
                results[key] = pending.pop(key).get()
            remaining = end - self.clock()
            if not pending or remaining <= 0:
                break
            # waits on the first page left, looking again at least every POLL_S: the end is read on self.clock
            next(iter(pending.values())).wait(min(remaining, POLL_S))
        if pending:  # a worker is stuck on a page: replace the pool rather than wait for it
            self.close()
        return results
