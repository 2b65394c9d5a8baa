"""HASH-RAG retrieval: learned binary codes, Hamming search, re-ranking, propositions mapped back to their sources.

The query side is the embedder plus a trained hash layer (`HashModel`): relaxed to tanh(beta * (W x + b)) while
training, sign() at inference with ties broken to +1. Database units (propositions) get codes from the same layer
(or the codes ADSH learned for them, see training/hash_training.py). A search is a funnel:

1. Hamming candidates: the radius widens until at least `alpha` units are found (the numpy engine keeps every unit
   at the final radius, ties included; the FAISS engines return the `alpha` nearest);
2. re-rank by the asymmetric score <v_q, h_p> (v_q the query's relaxed code, h_p the unit's +-1 code), keep `depth`;
3. optionally re-rank those by exact cosine over the stored float vectors (memory-mapped when loaded from a file);
4. units map to their source (chunk or page); each source keeps its best unit; the best k sources are returned.

One file holds an index: a JSON header (code length, dimension, embedder, engine, array layout, metadata) and the
raw arrays (the layer's weight and bias, the packed codes, the sources and, optionally, the float vectors).
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from models.llm.backend import BackendUnavailable

HashEngine = Literal["numpy", "faiss-flat", "faiss-hnsw"]
HASH_ENGINES = typing.get_args(HashEngine)

MAGIC = b"HASHRAG1"
_ALIGN = 64


class HashIndexError(BackendUnavailable):
    """An index or hash model that cannot be used: missing, corrupt, or made for another embedder/code length."""


def sign_bits(values: np.ndarray) -> np.ndarray:
    """sign() as booleans, True for +1; a zero (a tie) is +1."""
    return np.asarray(values) >= 0


def pack(bits: np.ndarray) -> np.ndarray:
    """Boolean codes (n, K) -> bit-packed uint8 (n, K/8)."""
    return np.packbits(np.atleast_2d(bits), axis=1)


_BYTE_SIGNS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(np.float32) * 2 - 1


def asymmetric_scores(relaxed: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """<v_q, h_p> for every packed code h_p, through a table of each code byte's contribution (256 x bytes), so
    the codes are never unpacked."""
    width = codes.shape[1]
    padded = np.zeros(width * 8, dtype=np.float32)
    padded[:len(relaxed)] = relaxed  # packbits pads with 0 bits; their weight is 0
    table = _BYTE_SIGNS @ padded.reshape(width, 8).T
    return table[codes, np.arange(width)].sum(axis=1)


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def hamming(query: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Hamming distances from one packed query code to every packed code, by popcount of the XOR (numpy >= 2's
    bitwise_count on 64-bit words; a byte table on older numpy, as the vLLM submission runtime pins)."""
    if not hasattr(np, "bitwise_count"):
        return _POPCOUNT[np.bitwise_xor(codes, query)].sum(axis=1, dtype=np.int64)
    if codes.shape[1] % 8 == 0 and codes.flags.c_contiguous:
        codes, query = codes.view(np.uint64), np.ascontiguousarray(query).view(np.uint64)
    return np.bitwise_count(np.bitwise_xor(codes, query)).sum(axis=1, dtype=np.int64)


def within_widening_radius(distances: np.ndarray, alpha: int, bits: int) -> np.ndarray:
    """Indices of the units within the smallest Hamming radius that holds at least `alpha` of them (all of them
    when there are fewer), nearest first."""
    if len(distances) <= alpha:
        return np.argsort(distances, kind="stable")
    radius = int(np.searchsorted(np.cumsum(np.bincount(distances, minlength=bits + 1)), alpha))
    inside = np.flatnonzero(distances <= radius)
    return inside[np.argsort(distances[inside], kind="stable")]


@dataclass
class HashModel:
    """The trained hash layer: `weight` (K, d) and `bias` (K,), for vectors of `embedder`."""

    weight: np.ndarray
    bias: np.ndarray
    embedder: str
    beta: float = 1.0

    @property
    def bits(self) -> int:
        return int(self.weight.shape[0])

    @property
    def dim(self) -> int:
        return int(self.weight.shape[1])

    def project(self, vectors: np.ndarray) -> np.ndarray:
        return np.asarray(vectors, dtype=np.float32) @ self.weight.T + self.bias

    def relaxed(self, vectors: np.ndarray) -> np.ndarray:
        """v_q: the query's relaxed code, tanh(beta * (W x + b))."""
        return np.tanh(self.beta * self.project(vectors))

    def codes(self, vectors: np.ndarray) -> np.ndarray:
        """Bit-packed sign codes of the vectors."""
        return pack(sign_bits(self.project(vectors)))

    def check(self, embedder: str | None = None, bits: int | None = None) -> None:
        if embedder is not None and embedder != self.embedder:
            raise HashIndexError(f"the hash model was trained on {self.embedder} vectors, not {embedder}: "
                                 f"retrain it with tools/train_hash.py")
        if bits is not None and bits != self.bits:
            raise HashIndexError(f"the hash model has {self.bits}-bit codes, the config asks for {bits}")


class _Engine:
    """Hamming candidate search over bit-packed codes; it holds the only copy of the codes."""

    @property
    def codes(self) -> np.ndarray:
        """The packed codes, in the order they were added (a view: valid until the next add)."""
        raise NotImplementedError

    def add(self, codes: np.ndarray) -> None:
        raise NotImplementedError

    def candidates(self, queries: np.ndarray, alpha: int) -> list[np.ndarray]:
        raise NotImplementedError


class NumpyEngine(_Engine):
    """Exact Hamming scan by popcount, with the widening radius."""

    def __init__(self, bits: int) -> None:
        self.bits = bits
        self._codes = np.zeros((0, bits // 8), dtype=np.uint8)

    @property
    def codes(self) -> np.ndarray:
        return self._codes

    def add(self, codes: np.ndarray) -> None:
        self._codes = np.ascontiguousarray(np.vstack([self._codes, codes]))

    def candidates(self, queries: np.ndarray, alpha: int) -> list[np.ndarray]:
        return [within_widening_radius(hamming(q, self.codes), alpha, self.bits) for q in queries]


class FaissEngine(_Engine):
    """FAISS binary index: IndexBinaryFlat (exact scan, SIMD popcount) or IndexBinaryHNSW (graph, sub-linear)."""

    def __init__(self, bits: int, kind: str, hnsw_m: int = 32) -> None:
        try:
            import faiss
        except ImportError as err:
            raise HashIndexError("the FAISS engines need faiss-cpu: pip install faiss-cpu") from err
        self.faiss, self.kind = faiss, kind
        # SWIG objects: their attributes (use_heap, storage, xb, hnsw) are not in faiss's type information
        self.index: Any
        self.storage: Any
        if kind == "faiss-flat":
            self.index = faiss.IndexBinaryFlat(bits)
            self.index.use_heap = False  # counts units per distance (the widening radius): fast for large alpha
            self.storage = self.index
        else:
            self.index = faiss.IndexBinaryHNSW(bits, hnsw_m)
            self.storage = faiss.downcast_IndexBinary(self.index.storage)

    @property
    def codes(self) -> np.ndarray:
        """A view of FAISS's own code storage, so the codes are in memory once."""
        size, width = self.storage.ntotal, self.storage.code_size
        if size == 0:
            return np.zeros((0, width), dtype=np.uint8)
        return self.faiss.rev_swig_ptr(self.storage.xb.data(), size * width).reshape(size, width)

    def add(self, codes: np.ndarray) -> None:
        if len(codes):
            self.index.add(np.ascontiguousarray(codes))

    def candidates(self, queries: np.ndarray, alpha: int) -> list[np.ndarray]:
        if self.index.ntotal == 0:
            return [np.zeros(0, dtype=np.int64) for _ in queries]
        alpha = min(alpha, self.index.ntotal)
        if self.kind == "faiss-hnsw":
            self.index.hnsw.efSearch = alpha
        _, ids = self.index.search(np.ascontiguousarray(queries), alpha)
        return [row[row >= 0] for row in ids]


def make_engine(name: str, bits: int, hnsw_m: int = 32) -> _Engine:
    if name == "numpy":
        return NumpyEngine(bits)
    if name in ("faiss-flat", "faiss-hnsw"):
        return FaissEngine(bits, name, hnsw_m)
    raise HashIndexError(f"unknown hash engine '{name}': use one of {', '.join(HASH_ENGINES)}")


@dataclass(frozen=True)
class SearchSettings:
    """`alpha`: Hamming candidates; `depth`: kept after <v_q, h_p>; `exact`: re-rank those by cosine."""

    alpha: int = 1000
    depth: int = 200
    exact: bool = True


@dataclass
class Hit:
    unit: int      # the unit (proposition) that matched best
    source: int    # its source (chunk or page)
    score: float   # cosine with exact re-ranking, else <v_q, h_p> / K


@dataclass
class HashIndex:
    """Units' codes (and optionally their float vectors) with the source each came from."""

    model: HashModel
    engine_name: str = "numpy"
    hnsw_m: int = 32
    sources: np.ndarray = field(init=False)
    vectors: np.ndarray | None = field(init=False, default=None)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sources = np.zeros(0, dtype=np.int32)
        self.engine = make_engine(self.engine_name, self.model.bits, self.hnsw_m)

    def __len__(self) -> int:
        return len(self.sources)

    @property
    def codes(self) -> np.ndarray:
        """The units' packed codes (held once, by the engine)."""
        return self.engine.codes

    def add(self, vectors: np.ndarray, sources: Sequence[int] | None = None, codes: np.ndarray | None = None,
            keep_vectors: bool = True) -> None:
        """Add units: their embeddings, the source of each (default: the unit itself) and, when ADSH learned
        them, their packed codes (default: the hash layer's). Float vectors are kept for exact re-ranking."""
        vectors = np.asarray(vectors, dtype=np.float32).reshape(-1, self.model.dim)
        codes = self.model.codes(vectors) if codes is None else np.asarray(codes, dtype=np.uint8)
        if len(codes) != len(vectors):
            raise ValueError(f"{len(codes)} codes for {len(vectors)} vectors")
        start = len(self)
        source_ids = np.arange(start, start + len(vectors)) if sources is None else np.asarray(sources)
        if len(source_ids) != len(vectors):
            raise ValueError(f"{len(source_ids)} sources for {len(vectors)} vectors")
        if start and keep_vectors != (self.vectors is not None):
            raise ValueError("keep_vectors must be the same for every add")
        self.sources = np.concatenate([self.sources, source_ids]).astype(np.int32)
        if keep_vectors:
            self.vectors = vectors if self.vectors is None else np.vstack([self.vectors, vectors])
        self.engine.add(codes)

    def search(self, queries: np.ndarray, k: int, settings: SearchSettings = SearchSettings()) -> list[list[Hit]]:
        """For each query vector, the best `k` sources (each with its best unit), best first. An index saved
        without float vectors ranks by <v_q, h_p> whatever `settings.exact` says."""
        queries = np.asarray(queries, dtype=np.float32).reshape(-1, self.model.dim)
        if k <= 0 or len(self) == 0:
            return [[] for _ in queries]
        stored = self.vectors if settings.exact else None
        relaxed = self.model.relaxed(queries)
        results = []
        for query, v_q, candidates in zip(queries, relaxed, self.engine.candidates(self.model.codes(queries),
                                                                                     settings.alpha)):
            scores = asymmetric_scores(v_q, self.codes[candidates]) / self.model.bits
            keep = np.argsort(-scores, kind="stable")[:max(settings.depth, k)]
            candidates, scores = candidates[keep], scores[keep]
            if stored is not None:
                ascending = np.argsort(candidates)  # a memory-mapped store is read in file order
                scores = np.empty(len(candidates), dtype=np.float32)
                scores[ascending] = np.asarray(stored[candidates[ascending]], dtype=np.float32) @ query
                order = np.argsort(-scores, kind="stable")
                candidates, scores = candidates[order], scores[order]
            results.append(self._by_source(candidates, scores, k))
        return results

    def _by_source(self, units: np.ndarray, scores: np.ndarray, k: int) -> list[Hit]:
        """The first (best) unit of each source, up to k sources."""
        hits: list[Hit] = []
        seen: set[int] = set()
        for unit, score in zip(units.tolist(), scores.tolist()):
            source = int(self.sources[unit])
            if source not in seen:
                seen.add(source)
                hits.append(Hit(unit, source, float(score)))
                if len(hits) == k:
                    break
        return hits

    def nbytes(self, with_vectors: bool = False) -> int:
        """Bytes of the searchable index: packed codes and source ids (and the float vectors when asked)."""
        size = self.codes.nbytes + self.sources.nbytes
        return size + (self.vectors.nbytes if with_vectors and self.vectors is not None else 0)

    # ----- one file: header + arrays -----

    def save(self, path: Path) -> None:
        arrays = {"weight": self.model.weight.astype(np.float32), "bias": self.model.bias.astype(np.float32),
                  "codes": self.codes, "sources": self.sources}
        if self.vectors is not None:
            arrays["vectors"] = np.asarray(self.vectors, dtype=np.float32)
        layout: dict[str, dict[str, Any]] = {}
        offset = 0
        for name, array in arrays.items():
            layout[name] = {"offset": offset, "dtype": array.dtype.str, "shape": list(array.shape)}
            offset += _aligned(array.nbytes)
        header = json.dumps({"bits": self.model.bits, "dim": self.model.dim, "embedder": self.model.embedder,
                             "beta": self.model.beta, "engine": self.engine_name, "hnsw_m": self.hnsw_m,
                             "arrays": layout, "metadata": self.metadata}).encode()
        start = _aligned(len(MAGIC) + 8 + len(header))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        with partial.open("wb") as out:
            out.write(MAGIC + len(header).to_bytes(8, "little") + header)
            for name, array in arrays.items():
                out.seek(start + layout[name]["offset"])
                out.write(np.ascontiguousarray(array).tobytes())
            out.truncate(start + offset)
        partial.replace(path)

    @classmethod
    def load(cls, path: Path, embedder: str | None = None, bits: int | None = None, engine: str | None = None,
             mmap_vectors: bool = True) -> HashIndex:
        """The index in `path`; checks the embedder name and code length when given. Float vectors are
        memory-mapped (read only where re-ranking touches them) unless `mmap_vectors` is off."""
        stored = IndexFile(Path(path))
        model = stored.model(embedder, bits)
        with stored.errors():
            index = cls(model, engine or stored.header["engine"], int(stored.header["hnsw_m"]),
                        metadata=stored.header["metadata"])
            has_vectors = "vectors" in stored.header["arrays"]
            index.vectors = stored.array("vectors", mmap_vectors) if has_vectors else None
            index.sources = stored.array("sources")
            index.engine.add(stored.array("codes"))
        return index


def load_model(path: Path, embedder: str | None = None, bits: int | None = None) -> HashModel:
    """Only the hash layer of an index file (what the pipeline's per-query indexes need)."""
    return IndexFile(Path(path)).model(embedder, bits)


class IndexFile:
    """An index file's JSON header and its arrays, read on demand."""

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise HashIndexError(f"hash index '{path}' does not exist: train one with tools/train_hash.py")
        self.path = path
        with path.open("rb") as handle:
            magic, size = handle.read(len(MAGIC)), handle.read(8)
            if magic != MAGIC or len(size) != 8:
                raise HashIndexError(f"'{path}' is not a hash index file: train one with tools/train_hash.py")
            length = int.from_bytes(size, "little")
            with self.errors():
                self.header = json.loads(handle.read(length))
        self.start = _aligned(len(MAGIC) + 8 + length)

    @contextmanager
    def errors(self) -> Iterator[None]:
        """A header or array that does not read as written becomes one HashIndexError naming the file."""
        try:
            yield
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as err:
            raise HashIndexError(f"hash index '{self.path}' is not valid ({err}): rebuild it") from err

    def array(self, name: str, mmap: bool = False) -> np.ndarray:
        with self.errors():
            spec = self.header["arrays"][name]
            dtype, shape, offset = np.dtype(spec["dtype"]), tuple(spec["shape"]), self.start + spec["offset"]
            count = int(np.prod(shape))
            if offset + count * dtype.itemsize > self.path.stat().st_size:
                raise HashIndexError(f"hash index '{self.path}' is truncated: rebuild it")
            if mmap:
                return np.memmap(self.path, dtype=dtype, mode="r", offset=offset, shape=shape)
            with self.path.open("rb") as handle:
                handle.seek(offset)
                return np.fromfile(handle, dtype=dtype, count=count).reshape(shape)

    def model(self, embedder: str | None, bits: int | None) -> HashModel:
        with self.errors():
            model = HashModel(self.array("weight"), self.array("bias"), self.header["embedder"],
                              float(self.header["beta"]))
        model.check(embedder, bits)
        return model


def _aligned(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN
