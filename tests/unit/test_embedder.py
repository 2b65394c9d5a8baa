"""The embedder's deadline path: batches of similar length, rows in the texts' order, a prefix when cut short."""

import numpy as np
import pytest

from models.config import EmbedderConfig
from models.retrieval.embedder import WINDOW_BATCHES, Embedder
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
