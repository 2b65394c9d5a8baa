"""Pages benchmark: the seed's web page recipe against ours, speed and answer recall, measured in one run.

(a) seed: trafilatura.extract(html) with default settings, plus BeautifulSoup(html, "html.parser") tables to
    Markdown, one process; (b) ours (utils.pages.process_html), one process; (c) ours with the worker pool.
Speed is measured on the real CRAG pages of ../shared/crag_sample (the 25 pages twice: 50 pages, one Task-3
query), or on data/ when that folder is absent. The cache is off: every page is processed every time.

Answer recall: the share of questions whose gold answer (or an alternative) occurs, as whole words, in the
references the references stage selects (same stage, same MiniLM embedder, same top-k and table budget), with
pages processed the seed's way or ours. "invalid question" answers are not counted (no page holds them).

The last line is: pages: seed X ms/page, ours Y ms/page, speedup Z.ZZx, pool W.WWx, recall ours R/N seed S/N
"""

from __future__ import annotations

import argparse
import bz2
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import trafilatura
from bs4 import BeautifulSoup

from evaluation.recall import recall
from models.config import REPO_ROOT, load_config
from models.retrieval.embedder import Embedder
from utils.chunking import seed_chunks, split_sentences
from utils.cli import command
from utils.pages import PageProcessor, PageSettings, ProcessedPage, process_html

SHARED = REPO_ROOT.parent / "shared" / "crag_sample" / "crag_public_sample_5.jsonl.bz2"
DATA = REPO_ROOT / "data" / "crag_sample.jsonl"


def seed_tables(html: str, page_name: str) -> list[str]:
    """The seed's tables: every <table> through BeautifulSoup's html.parser, a Markdown row per <tr>."""
    tables = []
    for table in BeautifulSoup(html, "html.parser").find_all("table"):
        rows = [[cell.get_text(" ", strip=True) for cell in tr.find_all(["th", "td"])] for tr in table.find_all("tr")]
        rows = [row for row in rows if any(row)]
        if rows:
            lines = ["| " + " | ".join(row) + " |" for row in rows]
            lines.insert(1, "| " + " | ".join("---" for _ in rows[0]) + " |")
            tables.append(f"Page name: {page_name}\n" + "\n".join(lines))
    return tables


def seed_page(html: str, page_name: str, settings: PageSettings) -> ProcessedPage:
    """The seed's recipe as written: trafilatura on the raw HTML, BS4 tables; chunked by the same rules as ours."""
    text = trafilatura.extract(html) or ""
    chunks = seed_chunks(split_sentences(text), settings.sentence_chars, settings.chunk_chars, settings.group_size)
    return ProcessedPage(chunks, [t[:settings.table_chars] for t in seed_tables(html, page_name)], "trafilatura")


class SeedProcessor:
    """PageProcessor's interface over the seed's recipe, so the same references stage ranks both."""

    def __init__(self, settings: PageSettings) -> None:
        self.settings = settings

    def process(self, pages: list[tuple[Any, str]], timeout_s: float) -> list[ProcessedPage | None]:
        return [seed_page(html, name, self.settings) if isinstance(html, str) else ProcessedPage()
                for html, name in pages]


def load(path: Path) -> list[dict[str, Any]]:
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _fmt(runs: list[float]) -> str:
    return "/".join(f"{run:.1f}" for run in runs)


def per_page_ms(run, pages: list[tuple[str, str]]) -> float:
    gc.collect()  # garbage left by the previous measurement must not be collected on this one's time
    started = time.perf_counter()
    run(pages)
    return (time.perf_counter() - started) * 1000 / len(pages)


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=0, help="pool size (default: one per CPU)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved runs of (a), (b), (c); the best is reported")
    args = parser.parse_args(argv)

    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    settings = PageSettings.from_config(config.references)
    sets = {"data": load(DATA)}
    if SHARED.exists():
        sets["real"] = load(SHARED)
    else:
        print(f"pages: {SHARED} is absent; speed is measured on data/ pages only (real CRAG pages skipped)")
    speed_set = "real" if "real" in sets else "data"
    unique = [(p["page_result"], p["page_name"]) for e in sets[speed_set] for p in e["search_results"]]
    pages = unique * 2
    print(f"pages: speed on {speed_set}: {len(unique)} pages twice = {len(pages)} pages, "
          f"{sum(len(h) for h, _ in pages) / 1e6:.1f} MB of HTML, {os.cpu_count()} CPUs")

    for html, name in unique[:2]:  # warm-up: first calls pay lazy imports and caches
        seed_page(html, name, settings)
        process_html(html, name, settings)

    seed_runs, ours_runs, pool_runs = [], [], []
    gc.collect()
    started = time.perf_counter()
    pool = PageProcessor(settings, workers=args.workers, use_cache=False)
    pool_start_s = time.perf_counter() - started
    try:
        pool.process(unique[:pool.workers], timeout_s=600)  # warm the workers' lazy imports
        for _ in range(args.repeat):  # interleaved, so that a slow spell of the machine hits all three
            results: list[ProcessedPage | None] = []
            # per_page_ms calls each function at once, inside this iteration
            pool_runs.append(per_page_ms(lambda ps: results.extend(pool.process(ps, timeout_s=600)), pages))  # noqa: B023
            ours_runs.append(per_page_ms(lambda ps: [process_html(h, n, settings) for h, n in ps], pages))
            seed_runs.append(per_page_ms(lambda ps: [seed_page(h, n, settings) for h, n in ps], pages))
            if any(r is None for r in results):
                raise SystemExit("pages: the pool lost pages")
    finally:
        pool.close()
    # Best of N, as timeit reports: on a shared machine the slow runs measure the neighbours, not the code.
    seed_ms, ours_ms, pool_ms = (min(runs) for runs in (seed_runs, ours_runs, pool_runs))
    print(f"  best of {args.repeat} interleaved runs")
    print(f"  (a) seed recipe, 1 process : {seed_ms:8.1f} ms/page  runs {_fmt(seed_runs)}")
    print(f"  (b) ours, 1 process        : {ours_ms:8.1f} ms/page  runs {_fmt(ours_runs)}")
    print(f"  (c) ours, pool of {pool.workers}        : {pool_ms:8.1f} ms/page  runs {_fmt(pool_runs)}; "
          f"{len(pages)} pages in {pool_ms * len(pages) / 1000:.2f} s wall (+ {pool_start_s:.2f} s pool start, once)")

    embedder = Embedder(config.embedder)
    ours_found = seed_found = total = 0
    for name, examples in sets.items():
        ours_proc = PageProcessor(settings, workers=1, use_cache=False)
        r_ours, n, t_ours = recall(examples, ours_proc, config, embedder)
        r_seed, _, t_seed = recall(examples, SeedProcessor(settings), config, embedder)
        print(f"  recall on {name:4s}: ours {r_ours}/{n}, seed {r_seed}/{n}; "
              f"answer-word recall ours {t_ours:.2f}, seed {t_seed:.2f}")
        ours_found, seed_found, total = ours_found + r_ours, seed_found + r_seed, total + n
    print(f"pages: seed {seed_ms:.0f} ms/page, ours {ours_ms:.0f} ms/page, speedup {seed_ms / ours_ms:.2f}x, "
          f"pool {ours_ms / pool_ms:.2f}x, recall ours {ours_found}/{total} seed {seed_found}/{total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
