"""The embedder's deadline path (batches of similar length, rows in the texts' order, a prefix when cut short) and
its bfloat16 precision."""

import numpy as np
import pytest

from models.config import EmbedderConfig
from models.retrieval.embedder import WINDOW_BATCHES, Embedder
from utils.hardware import bf16_supported
from utils.time_budget import Deadline


class CountingClock:
    """A clock that moves one second per reading: a Deadline(n) built on it expires after n `expired` calls."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture(scope="module")
def embedder():
    return Embedder(EmbedderConfig(batch_size=4))


TEXTS = [("word " * length).strip() for length in (3, 40, 1, 25, 7, 60, 2, 33, 9, 14, 5, 48)]


def test_with_a_deadline_the_rows_are_those_of_one_call_in_the_texts_order(embedder):
    whole = embedder.encode(TEXTS)
    timed = embedder.encode(TEXTS, deadline=Deadline(1e9))
    np.testing.assert_allclose(timed, whole, atol=1e-5)


def test_each_batch_holds_texts_of_similar_length(embedder, monkeypatch):
    seen: list[list[str]] = []
    encode = embedder.model.encode
    monkeypatch.setattr(embedder.model, "encode", lambda texts, **kw: seen.append(list(texts)) or encode(texts, **kw))
    embedder.encode(TEXTS, deadline=Deadline(1e9))
    assert len(TEXTS) <= 4 * WINDOW_BATCHES  # one window: the batches are the texts by length, longest first
    by_length = sorted(TEXTS, key=len, reverse=True)
    assert seen == [by_length[0:4], by_length[4:8], by_length[8:12]]


def test_a_deadline_passed_half_way_leaves_the_rows_of_the_first_texts_only(embedder):
    texts = [("word " * length).strip() for length in (50, 45, 40, 2, 35, 30, 1, 3, 25, 20, 4, 5)]
    deadline = Deadline(2.5, CountingClock())  # two batches (the 8 longest texts) are embedded, then it has passed
    rows = embedder.encode(texts, deadline=deadline)
    assert len(rows) == 3  # the fourth text is among the 4 shortest: the rows of texts after it are dropped
    np.testing.assert_allclose(rows, embedder.encode(texts[:3]), atol=1e-5)


def test_an_expired_deadline_embeds_nothing(embedder):
    assert embedder.encode(TEXTS, deadline=Deadline(0)).shape == (0, embedder.dimension)


def test_bfloat16_is_refused_where_the_device_lacks_it(monkeypatch):
    import models.retrieval.embedder as module
    from models.config import ConfigError

    monkeypatch.setattr(module, "bf16_supported", lambda device: False)
    with pytest.raises(ConfigError, match="set embedder.precision: float32"):
        Embedder(EmbedderConfig(precision="bfloat16"))


QUERY = "who directed the godfather"
PASSAGES = ["The Godfather is a 1972 American crime film directed by Francis Ford Coppola.",
            "Casablanca is a 1942 romantic drama directed by Michael Curtiz.",
            "The 1989 album was released by Taylor Swift on October 27, 2014.",
            ("word " * 200).strip()]


@pytest.mark.skipif(not bf16_supported("cpu"), reason="this CPU has neither AMX nor AVX512-BF16")
def test_bfloat16_vectors_are_float32_unit_vectors_that_rank_as_float32_does(embedder):
    half = Embedder(EmbedderConfig(batch_size=4, precision="bfloat16"))
    texts = [QUERY, *PASSAGES]
    exact, fast = embedder.encode(texts), half.encode(texts)
    assert fast.dtype == np.float32 and np.allclose(np.linalg.norm(fast, axis=1), 1.0, atol=1e-5)
    assert np.all((exact * fast).sum(axis=1) > 0.999)
    assert not np.array_equal(exact, fast)  # the autocast really ran: bfloat16 products round differently
    assert np.argsort(-(exact[1:] @ exact[0])).tolist() == np.argsort(-(fast[1:] @ fast[0])).tolist()
    # the deadline path gives the same vectors in bfloat16 too
    assert np.allclose(half.encode(texts, deadline=Deadline(float("inf"))), fast, atol=1e-6)
