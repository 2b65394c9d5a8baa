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


def openvino_embedder(tmp_path, **settings) -> Embedder:
    return Embedder(EmbedderConfig(batch_size=4, backend="openvino", cache_dir=str(tmp_path), **settings))


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_openvino_vectors_rank_as_torch_float32_does(embedder, tmp_path, precision):
    if precision == "bfloat16" and not bf16_supported("cpu"):
        pytest.skip("this CPU has neither AMX nor AVX512-BF16")
    converted = openvino_embedder(tmp_path, precision=precision)
    texts = [QUERY, *PASSAGES]
    exact, vectors = embedder.encode(texts), converted.encode(texts)
    assert vectors.dtype == np.float32 and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.all((exact * vectors).sum(axis=1) > (0.99999 if precision == "float32" else 0.999))
    assert np.argsort(-(exact[1:] @ exact[0])).tolist() == np.argsort(-(vectors[1:] @ vectors[0])).tolist()
    # batched by length in any order, the rows come back in the texts' order, with or without a deadline
    np.testing.assert_allclose(converted.encode(texts[::-1])[::-1], vectors, atol=1e-6)
    np.testing.assert_allclose(converted.encode(texts, deadline=Deadline(1e9)), vectors, atol=1e-6)


def test_openvino_converts_once_and_then_reads_its_cache(tmp_path, monkeypatch):
    import openvino

    first = openvino_embedder(tmp_path)
    [converted] = (tmp_path / "openvino").iterdir()
    assert converted.name.startswith(first.name) and (converted / "model.xml").is_file()

    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(openvino, "convert_model", refuse)
    again = openvino_embedder(tmp_path)
    np.testing.assert_array_equal(again.encode(PASSAGES), first.encode(PASSAGES))


def test_openvino_is_refused_off_the_cpu_and_for_a_folder_without_a_transformer(tmp_path):
    from models.config import ConfigError
    from models.retrieval.openvino_encoder import transformer_folder

    with pytest.raises(ConfigError, match="set embedder.backend: torch"):
        Embedder(EmbedderConfig(backend="openvino", device="cuda"))
    (tmp_path / "modules.json").write_text('[{"idx": 0, "path": "", "type": "sentence_transformers.models.CLIPModel"}]')
    with pytest.raises(ConfigError, match="is not a sentence-transformers Transformer"):
        transformer_folder(tmp_path)


def test_auto_precision_is_bfloat16_where_the_device_has_it_and_float32_elsewhere(monkeypatch):
    import utils.hardware

    for native, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(utils.hardware, "bf16_supported", lambda device, native=native: native)
        assert EmbedderConfig(precision="auto").effective_precision() == expected
    assert EmbedderConfig(precision="float32").effective_precision() == "float32"
