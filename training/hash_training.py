"""ADSH (asymmetric deep supervised hashing) training of the HASH-RAG hash layer.

The query side is the hash layer over frozen embeddings, relaxed as u = tanh(beta * (W x + b)) with the
continuation beta = sqrt(0.1 * step + 1); the database side is the code matrix V in {-1, +1}^(n x K), learned
directly. The loss is

    sum_i sum_j (u_i . v_j - K S_ij)^2  +  gamma * sum_i |v_(i) - u_i|^2

where S (m x n) is +1 where database unit j answers (or neighbours) query i, and the second term applies to
queries that are themselves database units (`query_index`). The paper's S is -1 elsewhere; `pair_similarity` and
`neighbour_similarity` default to 0 there instead ("unrelated" = half the bits differ): with a few positives per
query among thousands of units, -1 asks every unrelated pair to be antipodal, which destroys the neighbourhoods
the codes start from (measured in docs/decisions/hash-rag-defaults.md). Training alternates: the layer by Adam
with V fixed, then V with the layer fixed, bit by bit (the column-wise discrete update of the ADSH paper):

    Q = -2K S^T U - 2 gamma U_bar,   V[:, k] = -sign(Q[:, k] + 2 V_notk (U_notk^T U[:, k]))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from models.retrieval.hash_index import HashIndex, HashModel, SearchSettings, pack, sign_bits


@dataclass
class ADSHSettings:
    bits: int = 256
    outer: int = 10        # alternations of the layer step and the code step
    inner: int = 3         # epochs over the queries in each layer step
    gamma: float = 200.0
    lr: float = 1e-4
    batch_size: int = 64
    init: str = "pca"      # "pca": PCA directions under a random rotation; "random": Gaussian hyperplanes
    seed: int = 0


@dataclass
class ADSHResult:
    model: HashModel
    database_codes: np.ndarray  # bit-packed V, one row per database unit
    history: list[dict[str, float]] = field(default_factory=list)


def beta_at(step: int) -> float:
    return math.sqrt(0.1 * step + 1)


def initial_layer(database: np.ndarray, bits: int, init: str, rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(W, b) to start from: random hyperplanes through the origin, or the database's principal directions
    (centred; repeated under another rotation when bits > dim) turned by a random rotation."""
    dim = database.shape[1]
    if init == "random":
        return rng.standard_normal((bits, dim)).astype(np.float32) / math.sqrt(dim), np.zeros(bits, np.float32)
    if init != "pca":
        raise ValueError(f"unknown hash initialisation '{init}': use pca or random")
    mean = database.mean(axis=0)
    _, _, directions = np.linalg.svd(database - mean, full_matrices=False)
    rows: list[np.ndarray] = []
    while sum(len(r) for r in rows) < bits:
        take = min(bits - sum(len(r) for r in rows), len(directions))
        rotation = np.linalg.qr(rng.standard_normal((take, take)))[0]
        rows.append(rotation @ directions[:take])
    weight = np.vstack(rows).astype(np.float32)
    return weight, (-weight @ mean).astype(np.float32)


def update_codes(codes: np.ndarray, relaxed: np.ndarray, similarity: np.ndarray, gamma: float,
                 query_index: np.ndarray | None) -> np.ndarray:
    """ADSH's discrete step: V column by column, with U (the queries' relaxed codes) fixed. Ties go to +1."""
    bits = relaxed.shape[1]
    q = -2.0 * bits * (similarity.T @ relaxed)
    if query_index is not None:
        np.add.at(q, query_index, -2.0 * gamma * relaxed)
    codes = codes.astype(np.float32, copy=True)
    gram = relaxed.T @ relaxed  # (K, K): column k without its diagonal is U_notk^T U[:, k]
    for k in range(bits):
        others = gram[:, k].copy()
        others[k] = 0.0
        column = q[:, k] + 2.0 * (codes @ others)
        codes[:, k] = np.where(column > 0, -1.0, 1.0)
    return codes


def train_adsh(database: np.ndarray, queries: np.ndarray, similarity: np.ndarray, embedder: str,
               query_index: np.ndarray | None = None, settings: ADSHSettings = ADSHSettings(),
               progress: bool = True) -> ADSHResult:
    """Trains the hash layer and the database codes. `similarity` is (queries x database)."""
    if similarity.shape != (len(queries), len(database)):
        raise ValueError(f"similarity is {similarity.shape}, expected {(len(queries), len(database))}")
    rng = np.random.default_rng(settings.seed)
    torch.manual_seed(settings.seed)
    weight, bias = initial_layer(database, settings.bits, settings.init, rng)
    layer = torch.nn.Linear(database.shape[1], settings.bits)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
        layer.bias.copy_(torch.from_numpy(bias))
    optimiser = torch.optim.Adam(layer.parameters(), lr=settings.lr)
    x = torch.from_numpy(np.asarray(queries, dtype=np.float32))
    s = torch.from_numpy(np.asarray(similarity, dtype=np.float32))
    codes = np.where(sign_bits(database @ weight.T + bias), 1.0, -1.0).astype(np.float32)
    step, history = 0, []
    for outer in tqdm(range(settings.outer), desc="ADSH", disable=not progress):
        v = torch.from_numpy(codes)
        total = 0.0
        for _ in range(settings.inner):
            for batch in torch.randperm(len(x)).split(settings.batch_size):
                u = torch.tanh(beta_at(step) * layer(x[batch]))
                loss = ((u @ v.T - settings.bits * s[batch]) ** 2).sum()
                if query_index is not None:
                    loss = loss + settings.gamma * ((v[query_index[batch.numpy()]] - u) ** 2).sum()
                loss = loss / (len(batch) * len(database))
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                total += loss.item() * len(batch)
                step += 1
        with torch.no_grad():
            relaxed = torch.tanh(beta_at(step) * layer(x)).numpy()
        codes = update_codes(codes, relaxed, np.asarray(similarity, dtype=np.float32), settings.gamma, query_index)
        history.append({"round": outer + 1, "loss": total / (settings.inner * len(x)), "beta": beta_at(step)})
    model = HashModel(layer.weight.detach().numpy().copy(), layer.bias.detach().numpy().copy(), embedder,
                      beta_at(step))
    return ADSHResult(model, pack(codes > 0), history)


def pair_similarity(positives: list[list[int]], database_size: int, negative: float = 0.0) -> np.ndarray:
    """S for (query, positive units) pairs: +1 where a unit answers the query, `negative` elsewhere."""
    similarity = np.full((len(positives), database_size), negative, dtype=np.float32)
    for row, units in enumerate(positives):
        similarity[row, list(units)] = 1.0
    return similarity


def neighbour_similarity(database: np.ndarray, query_index: np.ndarray, neighbours: int,
                         negative: float = 0.0) -> np.ndarray:
    """S for unsupervised training: +1 for each sampled query's `neighbours` nearest units by cosine."""
    scores = database[query_index] @ database.T
    nearest = np.argpartition(-scores, neighbours - 1, axis=1)[:, :neighbours]
    return pair_similarity(nearest.tolist(), len(database), negative)


def positive_recall(found: list[list[int]], positives: list[set[int]], k: int) -> float:
    """Mean share of each query's positives (at most k of them) among its first k results."""
    if not found:
        return 0.0
    return float(np.mean([len(set(ids[:k]) & wanted) / min(len(wanted), k) for ids, wanted in zip(found, positives)]))


def recall_at(index: HashIndex, queries: np.ndarray, positives: list[set[int]], k: int,
              settings: SearchSettings = SearchSettings()) -> float:
    """positive_recall of the index's top-k sources."""
    found = index.search(queries, k, settings) if len(queries) else []
    return positive_recall([[hit.source for hit in hits] for hits in found], positives, k)
