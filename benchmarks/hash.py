"""HASH-RAG benchmark: exact cosine, FAISS IndexFlatIP, LSH and our hash index, measured in one run.

Corpus: the proposition embeddings (all-MiniLM-L6-v2) of the real CRAG pages in ../shared/crag_sample (else of
data/), topped up to N with synthetic clustered embeddings: cluster centres and spreads are drawn from the real
vectors' mean and covariance (clusters of about 10), so the synthetic part has the real spectrum. The script prints
the mean top-1 and top-20 neighbour similarity of both parts, so the calibration can be read. Queries are held-out
points of the same generator.

Before that, the references stage's answer recall with dense retrieval and with the hash retriever (an untrained
PCA-start layer; the gold answers are only counted, never fitted) on the real sample, on data/, and on a Task-3 set
(the real questions, else data/'s, each padded to 50 pages with other questions' pages as benchmarks/pages.py pads
them; the stage reads the best 20 by title and snippet), and the stage's seconds per question (pages are processed
once beforehand, so the seconds are the retrieval's).

After the sizes, the break-even line: the smallest collection at which our index answers a query faster than exact
search, between the two sizes measured on either side of it.

Methods, each with one thread and one query at a time (the RAG case):
- exact: numpy, the query against every float32 vector, top-k by argpartition;
- faiss-flat-ip: FAISS IndexFlatIP (exact, BLAS);
- lsh: random hyperplanes at the same code length, Hamming top-k in a FAISS IndexBinaryFlat, no re-rank;
- ours: the ADSH-trained hash layer (neighbour supervision on a sample; see hash_training.py), FAISS binary flat
  Hamming candidates (alpha), the asymmetric <v_q, h_p> re-rank (depth), then exact cosine over the float vectors
  memory-mapped from the saved index file; `ours (numpy)` is the same with the numpy popcount engine, `ours,
  codes only` without the exact re-rank, and `ours, PCA start` with the layer ADSH starts from (untrained).

512-bit codes by default, with alpha 4000 and depth 400: at N = 10^6 they reach a higher recall@20 than 256 bits
with a funnel half as wide, at 68 rather than 36 bytes a unit (--bits 256 --alpha 8000 --depth 800 to compare;
docs/decisions/hash-rag-defaults.md).

Index bytes: what a method keeps in memory to search: floats for exact and flat-ip, codes for LSH, codes and
source ids for ours. Our exact re-rank reads `depth` float rows per query from the memory-mapped file (N x d x 4
bytes on disk, reported separately); without it, recall is that of `ours, codes only`.
Recall@k is the share of the exact top-k found. The last line is:
hash: N=<largest N> speedup Xx vs exact, recall@20 R, index Yx smaller
"""

from __future__ import annotations

import argparse
import bz2
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import faiss
import numpy as np
from loguru import logger
from threadpoolctl import threadpool_limits

from evaluation.data import task3_pool, task3_set
from evaluation.recall import recall as answer_recall
from models.config import REPO_ROOT
from models.loading import load_config
from models.retrieval.embedder import Embedder
from models.retrieval.hash_index import HashIndex, HashModel, SearchSettings
from models.stages.hash_retriever import HashKeys, hash_settings, proposition_units
from models.state import Reference
from training.hash_training import ADSHSettings, initial_layer, neighbour_similarity, positive_recall, train_adsh
from utils.cli import command
from utils.web_pages import PageProcessor, PageSettings, process_html

SHARED = REPO_ROOT.parent / "shared" / "crag_sample" / "crag_public_sample_5.jsonl.bz2"
DATA = REPO_ROOT / "data" / "crag_sample.jsonl"
GATE_DEV = REPO_ROOT / "data" / "gate_dev.jsonl"
KS = (5, 20, 100)


def read_examples(path: Path) -> list[dict]:
    with (bz2.open(path, "rt") if path.suffix == ".bz2" else path.open()) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def real_vectors() -> np.ndarray:
    """Proposition embeddings of the real pages (the shared CRAG sample, else data/)."""
    config = load_config()
    examples = read_examples(SHARED if SHARED.is_file() else DATA)
    settings = PageSettings.from_config(config.references)
    refs = []
    for example in examples:
        for page in example["search_results"]:
            result = process_html(page.get("page_result") or "", page.get("page_name", ""), settings)
            refs += [Reference(text, "chunk") for text in result.chunks]
    texts, _ = proposition_units(refs, hash_settings(config))
    return Embedder(config.embedder).encode(list(dict.fromkeys(texts)))


class Generator:
    """Clustered unit vectors with the real vectors' mean and covariance."""

    def __init__(self, real: np.ndarray, spread: float, cluster_size: int, seed: int) -> None:
        self.mean = real.mean(axis=0)
        covariance = np.cov(real.T) + 1e-6 * np.eye(real.shape[1])
        self.factor = np.linalg.cholesky(covariance).astype(np.float32)
        self.spread, self.cluster_size = spread, cluster_size
        self.rng = np.random.default_rng(seed)

    def draw(self, n: int, block: int = 100_000) -> np.ndarray:
        out = np.empty((n, len(self.mean)), dtype=np.float32)
        for start in range(0, n, block):
            size = min(block, n - start)
            centres = self.mean + self._gauss(max(1, size // self.cluster_size))
            points = centres[self.rng.integers(0, len(centres), size)] + self.spread * self._gauss(size)
            out[start:start + size] = points / np.linalg.norm(points, axis=1, keepdims=True)
        return out

    def _gauss(self, n: int) -> np.ndarray:
        return self.rng.standard_normal((n, len(self.mean)), dtype=np.float32) @ self.factor.T


def neighbour_similarity_profile(vectors: np.ndarray) -> tuple[float, float]:
    """Mean similarity of each vector's nearest and 20th nearest other vector."""
    scores = vectors @ vectors.T
    np.fill_diagonal(scores, -np.inf)
    ranked = -np.sort(-scores, axis=1)
    return float(ranked[:, 0].mean()), float(ranked[:, min(19, len(vectors) - 2)].mean())


def exact_top(database: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    return np.stack([top_k(database @ q, k) for q in queries])


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    part = np.argpartition(-scores, k - 1)[:k]
    return part[np.argsort(-scores[part], kind="stable")]


def recall(found: list[np.ndarray], truth: np.ndarray, k: int) -> float:
    """Share of the exact top-k found in the top k."""
    return positive_recall([f.tolist() for f in found], [set(t[:k].tolist()) for t in truth], k)


def timed(search, queries: np.ndarray) -> tuple[list[np.ndarray], float]:
    """(results, mean ms per query), one query at a time, after one warm-up query."""
    search(queries[0])
    started = time.perf_counter()
    results = [search(q) for q in queries]
    return results, 1000 * (time.perf_counter() - started) / len(queries)


def train_ours(database: np.ndarray, bits: int, sample: int, neighbours: int, seed: int) -> HashModel:
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(database), min(sample, len(database)), replace=False)
    subset = database[rows]
    query_index = rng.choice(len(subset), max(1, len(subset) // 10), replace=False)
    similarity = neighbour_similarity(subset, query_index, min(neighbours, len(subset) - 1))
    settings = ADSHSettings(bits=bits, outer=5, inner=3, seed=seed)
    return train_adsh(subset, subset[query_index], similarity, "bench", query_index, settings, progress=False).model


def run_size(n: int, real: np.ndarray, generator: Generator, queries: np.ndarray, args: argparse.Namespace,
             folder: Path) -> dict[str, dict[str, float]]:
    database = np.vstack([real[:n], generator.draw(max(0, n - len(real)))]) if n > len(real) else real[:n]
    k_max = max(KS)
    truth = exact_top(database, queries, k_max)
    rows: dict[str, dict[str, float]] = {}

    def add(name: str, found: list[np.ndarray], ms: float, size: int) -> None:
        rows[name] = {"ms": ms, "bytes": size, **{f"r@{k}": recall(found, truth, k) for k in KS}}

    found, ms = timed(lambda q: top_k(database @ q, k_max), queries)
    add("exact", found, ms, database.nbytes)
    flat = faiss.IndexFlatIP(database.shape[1])
    flat.add(database)
    found, ms = timed(lambda q: flat.search(q[None], k_max)[1][0], queries)  # noqa: B023, F821 - timed() calls it at once; ruff reads the `del` below as unbinding the name
    add("faiss-flat-ip", found, ms, database.nbytes)
    del flat

    weight, bias = initial_layer(database, args.bits, "random", np.random.default_rng(args.seed))
    lsh = HashModel(weight, bias, "bench")
    binary = faiss.IndexBinaryFlat(args.bits)
    binary.add(lsh.codes(database))
    found, ms = timed(lambda q: binary.search(lsh.codes(q[None]), k_max)[1][0], queries)  # noqa: B023, F821 - timed() calls it at once; ruff reads the `del` below as unbinding the name
    add(f"lsh {args.bits} bits", found, ms, binary.ntotal * args.bits // 8)
    del binary

    settings = SearchSettings(args.alpha, args.depth, exact=True)
    weight, bias = initial_layer(database, args.bits, "pca", np.random.default_rng(args.seed))
    start = HashIndex(HashModel(weight, bias, "bench"), "faiss-flat")
    start.add(database, keep_vectors=True)
    found, ms = timed(lambda q: np.array([h.source for h in start.search(q, k_max, settings)[0]]), queries)  # noqa: B023, F821 - timed() calls it at once; ruff reads the `del` below as unbinding the name
    add("ours, PCA start", found, ms, start.nbytes())
    del start

    model = train_ours(database, args.bits, args.train_sample, args.neighbours, args.seed)
    built = HashIndex(model)
    built.add(database)
    path = folder / f"ours-{n}.hidx"
    built.save(path)
    del built
    for engine in ("faiss-flat", "numpy"):
        index = HashIndex.load(path, engine=engine)
        found, ms = timed(lambda q: np.array([h.source for h in index.search(q, k_max, settings)[0]]), queries)  # noqa: B023, F821 - timed() calls it at once; ruff reads the `del` below as unbinding the name
        add("ours" if engine == "faiss-flat" else "ours (numpy)", found, ms, index.nbytes())
        if engine == "faiss-flat":
            codes_only = SearchSettings(args.alpha, args.depth, exact=False)
            found, ms = timed(lambda q: np.array([h.source for h in index.search(q, k_max, codes_only)[0]]), queries)  # noqa: B023, F821 - timed() calls it at once; ruff reads the `del` below as unbinding the name
            add("ours, codes only", found, ms, index.nbytes())
            rows["ours"]["disk"] = index.vectors.nbytes
        del index
    path.unlink()
    return rows


def pipeline_recall(real: np.ndarray, bits: int, seed: int) -> None:
    """Answer recall of the references stage, dense against hash retrieval over sentence propositions, on the real
    sample and data/. The hash layer is the PCA start over the real propositions: no answer is used to fit it."""
    config = load_config()
    weight, bias = initial_layer(real, bits, "pca", np.random.default_rng(seed))
    embedder = Embedder(config.embedder)
    model = HashModel(weight, bias, embedder.name)
    hashed = replace(config, references=replace(config.references, retriever="hash")).with_keys(
        "references", HashKeys, hash=replace(hash_settings(config), model="in-memory"))
    sets = {"real": read_examples(SHARED), "data": read_examples(DATA)} if SHARED.is_file() else {
        "data": read_examples(DATA)}
    own = sets.get("real", sets["data"])
    sets["task3"] = task3_set(own, task3_pool({"real": own, "gate_dev": read_examples(GATE_DEV)}), seed)
    for name, examples in sets.items():
        counts = {}
        processor = PageProcessor(PageSettings.from_config(config.references), workers=1)  # caches pages in memory
        processor.process([(p["page_result"], p["page_name"]) for e in examples for p in e["search_results"]], 600)
        for label, chosen, layer in (("dense", config, None), ("hash", hashed, model)):
            started = time.perf_counter()
            found, total, words = answer_recall(examples, processor, chosen, embedder, layer)
            seconds = (time.perf_counter() - started) / max(total, 1)
            counts[label] = f"{found}/{total} (answer words {words:.2f}, stage {seconds:.2f} s/question)"
        print(f"pipeline answer recall on {name}, top-{config.references.top_k}: dense {counts['dense']}, "
              f"hash {bits} bits {counts['hash']}")


def break_even(speeds: list[tuple[int, float, float]]) -> str:
    """Where our index (search ms) first beats exact search (ms), from (N, exact ms, ours ms) by size: between the
    last size it lost at and the first it won at, log-linearly interpolated."""
    ordered = sorted(speeds)
    wins = [i for i, (_, exact, ours) in enumerate(ordered) if ours < exact]
    if not wins:
        return f"break-even: exact search was faster at every size measured (up to N={ordered[-1][0]})"
    first = wins[0]
    if first == 0:
        return f"break-even: ours was faster already at the smallest size, N={ordered[0][0]}"
    (n0, e0, o0), (n1, e1, o1) = ordered[first - 1], ordered[first]
    gap0, gap1 = np.log(o0 / e0), np.log(o1 / e1)  # > 0 where ours is slower
    at = float(np.exp(np.log(n0) + (np.log(n1) - np.log(n0)) * gap0 / (gap0 - gap1)))
    return f"break-even: ours is faster than exact from about N={at:,.0f} (slower at {n0}, faster at {n1})"


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--bits", type=int, default=512, help="code length (the pipeline's default is 256)")
    parser.add_argument("--alpha", type=int, default=4000, help="Hamming candidates")
    parser.add_argument("--depth", type=int, default=400, help="kept after <v_q, h_p>, re-ranked exactly")
    parser.add_argument("--train-sample", type=int, default=20_000, help="database rows ADSH trains on")
    parser.add_argument("--neighbours", type=int, default=100, help="positives per training query")
    parser.add_argument("--spread", type=float, default=0.8, help="synthetic cluster spread (x the real covariance)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    faiss.omp_set_num_threads(1)

    real = real_vectors()
    generator = Generator(real, args.spread, cluster_size=10, seed=args.seed)
    synthetic = generator.draw(len(real))
    print(f"corpus: {len(real)} real proposition vectors; neighbour similarity top-1/top-20: real "
          "{:.2f}/{:.2f}, synthetic {:.2f}/{:.2f}".format(*neighbour_similarity_profile(real),
                                                           *neighbour_similarity_profile(synthetic)))
    pipeline_recall(real, args.bits, args.seed)
    queries = generator.draw(args.queries)
    last: dict[str, float] = {}
    speeds: list[tuple[int, float, float]] = []
    with threadpool_limits(limits=1), tempfile.TemporaryDirectory(prefix="hashbench-") as folder:
        for n in args.sizes:
            rows = run_size(n, real, generator, queries, args, Path(folder))
            exact = rows["exact"]
            print(f"\nN={n}, d={real.shape[1]}, {args.queries} queries, alpha {args.alpha}, depth {args.depth}")
            print(f"  {'method':<18} {'ms/query':>9} {'speedup':>8} {'index MB':>9} {'smaller':>8} "
                  + " ".join(f"{'r@' + str(k):>6}" for k in KS))
            for name, row in rows.items():
                print(f"  {name:<18} {row['ms']:9.2f} {exact['ms'] / row['ms']:7.1f}x {row['bytes'] / 1e6:9.1f} "
                      f"{exact['bytes'] / row['bytes']:7.1f}x " + " ".join(f"{row[f'r@{k}']:6.3f}" for k in KS))
            print(f"  ours re-ranks {args.depth} rows per query from {rows['ours']['disk'] / 1e6:.0f} MB of "
                  "memory-mapped float vectors on disk")
            last = {"n": n, "speedup": exact["ms"] / rows["ours"]["ms"], "recall": rows["ours"]["r@20"],
                    "smaller": exact["bytes"] / rows["ours"]["bytes"]}
            speeds.append((n, exact["ms"], rows["ours"]["ms"]))
    print(break_even(speeds))
    print(f"hash: N={last['n']} speedup {last['speedup']:.1f}x vs exact, recall@20 {last['recall']:.2f}, "
          f"index {last['smaller']:.1f}x smaller")
    return 0


if __name__ == "__main__":
    sys.exit(main())
