"""Pages benchmark: from raw pages to ranked references, the seed's recipe against ours, measured in one run.

Extraction speed, single process, on the real CRAG pages of ../shared/crag_sample (25 pages twice: 50 pages, one
Task-3 query), or on data/ when that folder is absent; the cache is off, so every page is processed every time:
  (a) seed: trafilatura.extract(html) with default settings, plus BeautifulSoup(html, "html.parser") tables to
      Markdown (the seed's recipe as written; kept as it was at 03a70ff, so the ratio keeps its meaning);
  (b) ours with each extractor (`references.extractor`), one process; (c) ours, the default, in the worker pool.
Figures are the median of --repeat interleaved runs, with each run shown.

Embedding: the candidates of the real questions embedded in batches cut in the order they come (mixed lengths)
and in batches of similar length (Embedder.encode's deadline path), texts per second. Then each encoder the
device runs (`embedder.backend` torch or openvino, `embedder.precision` float32 or, where native, bfloat16) against
torch/float32 (interleaved, the median of --repeat): texts per second, the least cosine of a vector to its float32
one, and on every set the top-10 overlap (the mean over questions of |top-10 & float32's top-10| / 10, candidates
ranked by cosine to the query). The attributes SVM's predictions over every set's queries with each encoder.

Answer recall: the share of questions whose gold answer (or an alternative) occurs, as whole words, in the
references the references stage selects (same stage, MiniLM embedder, top-k and table budget), with pages
processed the seed's way or ours, on the real questions, data/ and data/gate_dev.jsonl. "invalid question" answers
are not counted. The token recall beside it is the mean share of the answer's words found.

Stage time: the references stage's wall seconds per real 5-page question (pages, candidates, embedding, ranking;
the page pool of configs/cpu.yaml, no cache), the median over the real questions, with the shipped encoder
(configs/cpu.yaml's) and torch/float32 in turn.

Task 3: each question keeps its own pages and is padded to 50 with pages of the other questions (the real pages
and data/gate_dev/pages), in a seeded random order; --task3-questions of them (the real ones first). Each
`references.max_pages` k is run with the shipped encoder: the query's pages ranked by title and snippet, the best k
parsed; 0 parses all. Recall and the median seconds per query, one query at a time. Then, at configs/cpu.yaml's
max_pages, every encoder in turn, question by question.

The last lines are:
pages: seed X ms/page, ours Y ms/page (resiliparse), trafilatura T ms/page, speedup Z.ZZx, pool W.WWx, recall ours
R/N trafilatura Q/N seed S/N
encoders: B/P shipped (backend/precision); recall ours torch/float32 R/N, ...
references (B/P shipped): torch/float32 F.FF s, B/P M.MM s (0.NNx torch/float32) per real 5-page question ...
task3 by encoder, max_pages 20: torch/float32 F.FF s, ..., B/P A.AA s (0.NNx torch/float32); recall ...
task3 (B/P): all 50 pages A.AA s/query recall R/N; max_pages k: B.BB s/query recall R/N; ...
"""

from __future__ import annotations

import argparse
import bz2
import cProfile
import gc
import json
import os
import pstats
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import trafilatura
from bs4 import BeautifulSoup

from evaluation.data import TASK3_PAGES, task3_pool, task3_set
from evaluation.recall import answer_found, recall, token_recall
from models.config import REPO_ROOT, resolve_path
from models.loading import load_config
from models.retrieval.embedder import Embedder
from models.stages.attributes import SVMAttributes
from models.stages.references import ReferencesStage, candidates
from models.stages.stage import run_alone
from models.state import QueryState
from utils.chunking import seed_chunks, split_sentences
from utils.cli import command
from utils.hardware import bf16_supported
from utils.time_budget import Deadline
from utils.web_pages import EXTRACTORS, PageProcessor, PageSettings, ProcessedPage, process_html

SHARED = REPO_ROOT.parent / "shared" / "crag_sample" / "crag_public_sample_5.jsonl.bz2"
DATA = REPO_ROOT / "data" / "crag_sample.jsonl"
GATE_DEV = REPO_ROOT / "data" / "gate_dev.jsonl"
TOP_K = 10  # the rankings' agreement is read over the best ten candidates of each question
BACKENDS = ("torch", "openvino")
PRECISIONS = ("float32", "bfloat16")
BASELINE = "torch/float32"


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


def extraction(unique: list[tuple[str, str]], settings: PageSettings, workers: int, repeat: int) -> dict[str, float]:
    """Median ms/page of the seed, ours with each extractor (one process) and ours in the pool; prints each."""
    pages = unique * 2
    ours = {name: replace(settings, extractor=name) for name in EXTRACTORS}
    for html, name in unique[:2]:  # warm-up: first calls pay lazy imports and caches
        seed_page(html, name, settings)
        for page_settings in ours.values():
            process_html(html, name, page_settings)
    runs: dict[str, list[float]] = {"seed": [], **{name: [] for name in ours}, "pool": []}
    started = time.perf_counter()
    pool = PageProcessor(settings, workers=workers, use_cache=False)
    pool_start_s = time.perf_counter() - started
    try:
        pool.process(unique[:pool.workers], timeout_s=600)  # warm the workers' lazy imports
        for _ in range(repeat):  # interleaved, so that a slow spell of the machine hits all of them
            results: list[ProcessedPage | None] = []
            # per_page_ms calls each function at once, inside this iteration
            runs["pool"].append(per_page_ms(lambda ps: results.extend(pool.process(ps, timeout_s=600)), pages))  # noqa: B023
            for name, page_settings in ours.items():
                runs[name].append(per_page_ms(lambda ps: [process_html(h, n, page_settings) for h, n in ps], pages))  # noqa: B023
            runs["seed"].append(per_page_ms(lambda ps: [seed_page(h, n, settings) for h, n in ps], pages))
            if any(r is None for r in results):
                raise SystemExit("pages: the pool lost pages")
    finally:
        pool.close()
    medians = {name: statistics.median(values) for name, values in runs.items()}
    print(f"  median of {repeat} interleaved runs, {len(pages)} pages each")
    print(f"  (a) seed recipe, 1 process      : {medians['seed']:7.1f} ms/page  runs {_fmt(runs['seed'])}")
    for name in ours:
        print(f"  (b) ours, {name:11s}, 1 process: {medians[name]:7.1f} ms/page  runs {_fmt(runs[name])}")
    print(f"  (c) ours, {settings.extractor}, pool of {pool.workers}: {medians['pool']:7.1f} ms/page  runs "
          f"{_fmt(runs['pool'])}; + {pool_start_s:.2f} s pool start, once")
    return medians


def question_candidates(examples: list[dict[str, Any]], config: Any) -> list[tuple[str, list[str]]]:
    """Per question, its query and the candidate texts the references stage embeds for it."""
    settings = PageSettings.from_config(config.references)
    found = []
    for example in examples:
        pages = example["search_results"]
        processed = [process_html(p.get("page_result"), str(p.get("page_name")), settings) for p in pages]
        found.append((example["query"], [ref.embedded_as() for ref in candidates(pages, processed,
                                                                                config.references.use_snippets)]))
    return found


def embedding(questions: list[tuple[str, list[str]]], config: Any, embedder: Embedder) -> None:
    """Texts per second with batches cut in arrival order against Embedder.encode's batches of similar length."""
    texts = [text for _, texts in questions for text in texts]
    size = config.embedder.batch_size
    embedder.encode(texts[:size])  # warm-up
    started = time.perf_counter()
    for start in range(0, len(texts), size):
        embedder.encode(texts[start:start + size])
    arrival = len(texts) / (time.perf_counter() - started)
    started = time.perf_counter()
    embedder.encode(texts, deadline=Deadline(float("inf")))
    sorted_rate = len(texts) / (time.perf_counter() - started)
    print(f"embedding: {len(texts)} candidates, batches of {size}: in arrival order {arrival:.0f} texts/s, "
          f"of similar length {sorted_rate:.0f} texts/s ({sorted_rate / arrival:.2f}x)")


def top_overlap(reference: tuple[np.ndarray, list[np.ndarray]], other: tuple[np.ndarray, list[np.ndarray]],
                k: int = TOP_K) -> float:
    """The mean over questions of |top-k of `other` & top-k of `reference`| / k, each question's candidates ranked by
    cosine to its query (queries as rows, candidates as one matrix per question); k shrinks to the candidates."""
    shares = []
    for query_a, cands_a, query_b, cands_b in zip(reference[0], reference[1], other[0], other[1]):
        n = min(k, len(cands_a))
        if n:
            top_a = set(np.argsort(-(cands_a @ query_a), kind="stable")[:n].tolist())
            top_b = set(np.argsort(-(cands_b @ query_b), kind="stable")[:n].tolist())
            shares.append(len(top_a & top_b) / n)
    return float(np.mean(shares)) if shares else 1.0


def encoder_settings(config: Any) -> dict[str, Any]:
    """Each `embedder.backend`/`embedder.precision` pair the device runs (bfloat16 only where it is native, OpenVINO
    only on the CPU), by label, torch/float32 first: the baseline every other is compared with."""
    native = bf16_supported(config.embedder.device)
    return {f"{backend}/{precision}": replace(config.embedder, backend=backend, precision=precision)
            for backend in BACKENDS for precision in PRECISIONS
            if (precision == "float32" or native) and (backend == "torch" or config.embedder.device == "cpu")}


def label_of(settings: Any) -> str:
    return f"{settings.backend}/{settings.effective_precision()}"


def encoders(questions: dict[str, list[tuple[str, list[str]]]], speed_set: str, encoders_: dict[str, Embedder],
             rounds: int) -> None:
    """Each encoder against torch/float32 in one run: texts/s on the speed set's candidates (the stage's path,
    `rounds` interleaved runs, the median), the least cosine of a vector to its float32 one, and the top-10 overlap
    of each set's rankings with float32's."""
    texts = [text for _, candidates_ in questions[speed_set] for text in candidates_]
    times: dict[str, list[float]] = {name: [] for name in encoders_}
    for encoder in encoders_.values():
        encoder.encode(texts[:encoder.config.batch_size])  # warm-up
    for _ in range(rounds):
        for name, encoder in encoders_.items():
            started = time.perf_counter()
            encoder.encode(texts, deadline=Deadline(float("inf")))
            times[name].append(time.perf_counter() - started)
    vectors = {name: {set_name: embedded(encoder, found) for set_name, found in questions.items()}
               for name, encoder in encoders_.items()}
    base = statistics.median(times[BASELINE])
    for name in encoders_:
        rate = len(texts) / statistics.median(times[name])
        cosine = min(float(np.min(np.sum(np.vstack(a[1] + [a[0]]) * np.vstack(b[1] + [b[0]]), axis=1)))
                     for a, b in zip(vectors[BASELINE].values(), vectors[name].values()))
        overlaps = ", ".join(f"{set_name} {top_overlap(vectors[BASELINE][set_name], vectors[name][set_name]):.1%}"
                             for set_name in questions)
        print(f"embedding {name}: {rate:.0f} texts/s ({base / statistics.median(times[name]):.2f}x {BASELINE}, "
              f"{_fmt([len(texts) / t for t in times[name]])}); least cosine to {BASELINE} {cosine:.5f}; "
              f"top-{TOP_K} overlap with {BASELINE}: {overlaps}")


def attribute_predictions(sets: dict[str, list[dict[str, Any]]], encoders_: dict[str, Embedder],
                          config: Any) -> None:
    """The attributes SVM (trained on torch float32 vectors) over every set's queries with each encoder: domains and
    dynamism right against the sets' labels, and the questions whose prediction differs from torch/float32's."""
    svm = SVMAttributes.load(resolve_path(config.attributes.svm_model))
    examples = [example for examples in sets.values() for example in examples]
    queries = [example["query"] for example in examples]
    predicted = {label: svm.predict(encoder.encode(queries)) for label, encoder in encoders_.items()}
    parts = []
    for label, pairs in predicted.items():
        domains = sum(domain == e["domain"] for (domain, _), e in zip(pairs, examples))
        dynamism = sum(kind == e["static_or_dynamic"] for (_, kind), e in zip(pairs, examples))
        differ = sum(pair != base for pair, base in zip(pairs, predicted[BASELINE]))
        parts.append(f"{label} domain {domains}, dynamism {dynamism}, {differ} differ")
    print(f"attributes SVM on {len(queries)} queries (right of {len(queries)}; predictions that differ from "
          f"{BASELINE}'s): " + "; ".join(parts))


def embedded(encoder: Embedder, questions: list[tuple[str, list[str]]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The queries' vectors as rows, and each question's candidates' vectors."""
    queries = encoder.encode([query for query, _ in questions])
    return queries, [encoder.encode(texts) for _, texts in questions]


def stage_seconds(examples: list[dict[str, Any]], config: Any, embedder: Embedder,
                  processor: PageProcessor) -> tuple[list[float], list[bool], list[float]]:
    """Per question, one at a time: the references stage's wall seconds, whether the answer was found, and the
    token recall."""
    seconds, found, tokens = [], [], []
    resources = {"embedder": embedder, "pages": processor, "hash_model": None, "reranker": None, "llm": None}
    for n, example in enumerate(examples):
        state = QueryState(n, example["interaction_id"], example["query"], example["query_time"],
                           example["search_results"])
        gc.collect()
        started = time.perf_counter()
        run_alone(ReferencesStage(), [state], config, resources)
        seconds.append(time.perf_counter() - started)
        texts = [ref.text for ref in state.references]
        found.append(answer_found(example, texts))
        tokens.append(token_recall(example, texts))
    return seconds, found, tokens


def interleaved(examples: list[dict[str, Any]], config: Any, embedders: dict[str, Embedder],
                processor: PageProcessor) -> dict[str, tuple[list[float], list[bool]]]:
    """stage_seconds under each embedder, question by question in turn (a busy spell slows them all alike): per
    embedder, the seconds and whether the answer was found."""
    timed: dict[str, tuple[list[float], list[bool]]] = {label: ([], []) for label in embedders}
    for example in examples:
        for label, embedder in embedders.items():
            seconds, found, _ = stage_seconds([example], config, embedder, processor)
            timed[label][0].extend(seconds)
            timed[label][1].extend(found)
    return timed


def _against(timed: dict[str, tuple[list[float], list[bool]]]) -> str:
    """"torch/float32 F s, other X s (0.NNx torch/float32), ...": each embedder's median seconds and its ratio."""
    base = statistics.median(timed[BASELINE][0])
    return ", ".join(f"{label} {statistics.median(seconds):.2f} s"
                     + ("" if label == BASELINE else f" ({statistics.median(seconds) / base:.2f}x {BASELINE})")
                     for label, (seconds, _) in timed.items())


def profile(sets: dict[str, list[dict[str, Any]]], config: Any, workers: int) -> int:
    """The references stage's 15 costliest calls (cumulative) on the first 5-page question and on it padded to
    TASK3_PAGES pages, with the configured `max_pages`."""
    embedder = Embedder(config.embedder)
    processor = PageProcessor(PageSettings.from_config(config.references), workers=workers, use_cache=False)
    first = next(iter(sets.values()))[0]
    pool = task3_pool(sets)
    try:
        stage_seconds([first], config, embedder, processor)  # warm-up: lazy imports, the pool's workers
        for label, example in (("5-page", first), (f"{TASK3_PAGES}-page", task3_set([first], pool)[0])):
            profiler = cProfile.Profile()
            profiler.enable()
            seconds, _, _ = stage_seconds([example], config, embedder, processor)
            profiler.disable()
            print(f"profile: {label} query, {seconds[0]:.2f} s")
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(15)
    finally:
        processor.close()
    return 0


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=0, help="pool size (default: one per CPU)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved extraction runs; the median is reported")
    parser.add_argument("--task3-questions", type=int, default=24,
                        help="Task-3 questions timed and scored (the real ones first, then gate_dev's)")
    parser.add_argument("--max-pages", default="5,10,20", help="the references.max_pages values of the Task-3 lines")
    parser.add_argument("--profile", action="store_true",
                        help="instead: cProfile of the references stage on a real 5-page and a Task-3 query")
    args = parser.parse_args(argv)
    try:
        ks = [int(k) for k in args.max_pages.split(",") if k.strip()]
    except ValueError:
        raise SystemExit(f"pages: --max-pages {args.max_pages!r} is not a comma-separated list of integers") from None

    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    settings = PageSettings.from_config(config.references)
    sets = {"data": load(DATA), "gate_dev": load(GATE_DEV)}
    if SHARED.exists():
        sets = {"real": load(SHARED), **sets}
    else:
        print(f"pages: {SHARED} is absent; speed is measured on data/ pages only (real CRAG pages skipped)")
    speed_set = "real" if "real" in sets else "data"
    unique = [(p["page_result"], p["page_name"]) for e in sets[speed_set] for p in e["search_results"]]
    print(f"pages: speed on {speed_set}: {len(unique)} pages twice, {2 * sum(len(h) for h, _ in unique) / 1e6:.1f} MB "
          f"of HTML; {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, OMP_NUM_THREADS "
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}")
    if args.profile:
        return profile(sets, config, args.workers)
    ms = extraction(unique, settings, args.workers, args.repeat)

    encoders_ = {label: Embedder(settings_) for label, settings_ in encoder_settings(config).items()}
    shipped = label_of(config.embedder)
    embedder = encoders_[shipped]
    questions = {name: question_candidates(examples, config) for name, examples in sets.items()}
    embedding(questions[speed_set], config, embedder)
    encoders(questions, speed_set, encoders_, args.repeat)
    attribute_predictions(sets, encoders_, config)

    found: dict[str, int] = {}
    total = 0
    for name, examples in sets.items():
        processors = {"ours": PageProcessor(settings, workers=1, use_cache=False),
                      "trafilatura": PageProcessor(replace(settings, extractor="trafilatura"), workers=1,
                                                   use_cache=False),
                      "seed": SeedProcessor(settings)}
        line = []
        for label, processor in processors.items():
            hits, n, tokens = recall(examples, processor, config, embedder)
            found[label] = found.get(label, 0) + hits
            line.append(f"{label} {hits}/{n} (tokens {tokens:.2f})")
        for label, encoder in encoders_.items():
            if label != shipped:
                hits, n, tokens = recall(examples, processors["ours"], config, encoder)
                found[label] = found.get(label, 0) + hits
                line.append(f"{label} {hits}/{n} (tokens {tokens:.2f})")
        total += n
        print(f"  recall on {name:8s}: " + ", ".join(line))
    found[shipped] = found["ours"]  # the shipped encoder's recall is the "ours" column
    print(f"pages: seed {ms['seed']:.0f} ms/page, ours {ms[settings.extractor]:.1f} ms/page ({settings.extractor}), "
          f"trafilatura {ms['trafilatura']:.1f} ms/page, speedup {ms['seed'] / ms[settings.extractor]:.2f}x, "
          f"pool {ms[settings.extractor] / ms['pool']:.2f}x, recall ours {found['ours']}/{total} trafilatura "
          f"{found['trafilatura']}/{total} seed {found['seed']}/{total}")
    print(f"encoders: {shipped} shipped; recall ours " + ", ".join(f"{label} {found[label]}/{total}"
                                                                     for label in encoders_))

    compared = {label: encoders_[label] for label in dict.fromkeys((BASELINE, shipped))}
    processor = PageProcessor(settings, workers=args.workers, use_cache=False)
    try:
        five = sets[speed_set]
        stage_seconds(five[:1], config, embedder, processor)  # warm-up: the new pool's workers import lazily
        timed = interleaved(five, config, compared, processor)
        print(f"references ({shipped} shipped): {_against(timed)} per {speed_set} 5-page question (median of "
              f"{len(five)}; each {_fmt(timed[shipped][0])})")

        pool = task3_pool(sets)
        questions_ = [e for name in ("real", "gate_dev") for e in sets.get(name, [])][:args.task3_questions]
        task3 = task3_set(questions_, pool)
        configured = config.references.max_pages
        parts = []
        for k in [0, *ks]:
            config.references.max_pages = k
            seconds, hits, tokens = stage_seconds(task3, config, embedder, processor)
            label = f"all {TASK3_PAGES} pages" if k == 0 else f"max_pages {k}"
            print(f"  task3 {label:13s}: {statistics.median(seconds):5.2f} s/query (median; max "
                  f"{max(seconds):.2f}), recall {sum(hits)}/{len(hits)}, token recall {np.mean(tokens):.2f}")
            parts.append(f"{label} {statistics.median(seconds):.2f} s/query recall {sum(hits)}/{len(hits)}")
        config.references.max_pages = configured
        timed = interleaved(task3, config, encoders_, processor)
        print(f"task3 by encoder, max_pages {configured}: {_against(timed)}; recall "
              + ", ".join(f"{label} {sum(hits)}/{len(hits)}" for label, (_, hits) in timed.items()))
        print(f"task3 ({shipped}): " + "; ".join(parts))
    finally:
        processor.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
