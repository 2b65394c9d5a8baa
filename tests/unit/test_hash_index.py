"""HASH-RAG: codes, Hamming search and its widening radius, re-ranking, engines, the index file, ADSH training,
propositions, and the hash retriever with the PGCC prompt in the pipeline."""

import numpy as np
import pytest

from models.config import ConfigError
from models.loading import load_config
from models.retrieval.hash_index import (
    HashIndex,
    HashIndexError,
    HashModel,
    SearchSettings,
    asymmetric_scores,
    hamming,
    pack,
    sign_bits,
    within_widening_radius,
)
from models.stages.hash_retriever import PROPOSITIONS, hash_settings, read_propositions
from models.state import QueryState, Reference
from tests.conftest import to_batch
from tests.fakes import HashEmbedder, ScriptedLLM, by_prompt
from training.hash_training import (
    ADSHSettings,
    beta_at,
    initial_layer,
    neighbour_similarity,
    pair_similarity,
    recall_at,
    train_adsh,
    update_codes,
)
from utils.chunking import sentence_units


def unit_rows(rng, n, dim):
    rows = rng.standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def model_for(vectors, bits=64, seed=0, embedder="test"):
    weight, bias = initial_layer(vectors, bits, "pca", np.random.default_rng(seed))
    return HashModel(weight, bias, embedder)


def clustered(rng, clusters, per_cluster, dim, spread):
    centres = unit_rows(rng, clusters, dim)
    labels = np.repeat(np.arange(clusters), per_cluster)
    points = centres[labels] + spread * rng.standard_normal((len(labels), dim)).astype(np.float32) / np.sqrt(dim)
    return points / np.linalg.norm(points, axis=1, keepdims=True), labels


# ----- codes -----

def test_sign_breaks_ties_to_plus_one_and_packs_msb_first():
    bits = sign_bits(np.array([[0.0, -1e-9, 2.0, -3.0, 0.0, 0.0, 0.0, -0.0]]))
    assert bits.tolist() == [[True, False, True, False, True, True, True, True]]
    assert pack(bits).tolist() == [[0b10101111]]


@pytest.mark.parametrize("old_numpy", [False, True])
def test_hamming_counts_differing_bits(monkeypatch, old_numpy):
    if old_numpy:  # the submission runtime's numpy 1.x has no bitwise_count
        monkeypatch.delattr(np, "bitwise_count")
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 256, (50, 16), dtype=np.uint8)
    query = codes[3]
    assert hamming(query, codes).tolist() == [int(np.unpackbits(row ^ query).sum()) for row in codes]
    short = np.ascontiguousarray(codes[:, :3])  # not whole 64-bit words
    assert hamming(query[:3], short).tolist() == [int(np.unpackbits(row ^ query[:3]).sum()) for row in short]


def test_asymmetric_scores_equal_the_inner_product_with_the_signs():
    rng = np.random.default_rng(2)
    relaxed = rng.standard_normal(20).astype(np.float32)  # 20 bits: the last byte is padded
    codes = pack(rng.random((30, 20)) > 0.5)
    signs = np.unpackbits(codes, axis=1, count=20).astype(np.float32) * 2 - 1
    np.testing.assert_allclose(asymmetric_scores(relaxed, codes), signs @ relaxed, rtol=1e-5, atol=1e-5)


def test_radius_widens_until_alpha_and_keeps_ties_at_the_radius():
    distances = np.array([5, 1, 3, 3, 3, 9, 0])
    assert within_widening_radius(distances, 2, 16).tolist() == [6, 1]
    assert within_widening_radius(distances, 3, 16).tolist() == [6, 1, 2, 3, 4]  # radius 3 holds 5 units
    assert within_widening_radius(distances, 10, 16).tolist() == [6, 1, 2, 3, 4, 0, 5]  # fewer than alpha: all


# ----- search -----

@pytest.mark.parametrize("engine", ["numpy", "faiss-flat", "faiss-hnsw"])
def test_exact_rerank_finds_the_exact_top_k(engine):
    rng = np.random.default_rng(3)
    database = unit_rows(rng, 500, 32)
    queries = unit_rows(rng, 10, 32)
    index = HashIndex(model_for(database), engine)
    index.add(database)
    found = index.search(queries, 5, SearchSettings(alpha=500, depth=500, exact=True))
    for query, hits in zip(queries, found):
        assert [h.source for h in hits] == np.argsort(-(database @ query), kind="stable")[:5].tolist()
        np.testing.assert_allclose([h.score for h in hits], np.sort(database @ query)[::-1][:5], rtol=1e-5)


def test_flat_engines_find_the_nearest_codes():
    rng = np.random.default_rng(4)
    database = unit_rows(rng, 300, 16)
    model = model_for(database, bits=16)  # short codes: many ties at each distance
    codes = model.codes(database)
    found = {}
    for engine in ("numpy", "faiss-flat"):
        index = HashIndex(model, engine)
        index.add(database)
        found[engine] = index.engine.candidates(model.codes(database[:5]), 40)
    for query, numpy_ids, faiss_ids in zip(codes[:5], found["numpy"], found["faiss-flat"]):
        distances = hamming(query, codes)
        radius = np.sort(distances)[39]
        assert len(faiss_ids) == 40 and set(faiss_ids.tolist()) <= set(numpy_ids.tolist())
        assert sorted(distances[faiss_ids].tolist()) == np.sort(distances)[:40].tolist()
        assert set(numpy_ids.tolist()) == set(np.flatnonzero(distances <= radius).tolist())


def test_codes_only_ranks_by_the_asymmetric_score():
    rng = np.random.default_rng(5)
    database = unit_rows(rng, 200, 16)
    model = model_for(database, bits=32)
    index = HashIndex(model)
    index.add(database, keep_vectors=False)
    query = database[7]
    hits = index.search(query, 200, SearchSettings(alpha=200, depth=200, exact=True))[0]  # no vectors: codes only
    expected = asymmetric_scores(model.relaxed(query[None])[0], model.codes(database)) / 32
    assert [h.score for h in hits] == pytest.approx(sorted(expected, reverse=True), abs=1e-6)


def test_identical_codes_tie_and_every_unit_is_returned():
    database = np.tile(np.array([[1.0, 0.0, 0.0, 0.0]], dtype=np.float32), (6, 1))
    model = HashModel(np.eye(8, 4, dtype=np.float32), np.zeros(8, np.float32), "test")
    index = HashIndex(model)
    index.add(database)
    hits = index.search(database[0], 10, SearchSettings(alpha=2, depth=2, exact=True))[0]
    assert sorted(h.source for h in hits) == [0, 1, 2, 3, 4, 5]  # the radius keeps the tied units
    assert all(h.score == pytest.approx(1.0) for h in hits)


def test_empty_index_and_k_beyond_n():
    rng = np.random.default_rng(6)
    model = model_for(unit_rows(rng, 20, 8), bits=16)
    for engine in ("numpy", "faiss-flat", "faiss-hnsw"):
        index = HashIndex(model, engine)
        assert index.search(unit_rows(rng, 2, 8), 5) == [[], []]
        index.add(unit_rows(rng, 3, 8))
        assert len(index.search(unit_rows(rng, 1, 8), 50)[0]) == 3
        assert index.search(unit_rows(rng, 1, 8), 0) == [[]]


def test_propositions_map_to_sources_each_once():
    rng = np.random.default_rng(7)
    database = unit_rows(rng, 12, 8)
    index = HashIndex(model_for(database, bits=16))
    index.add(database, sources=[0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3, 3])
    hits = index.search(database[4], 10, SearchSettings(alpha=12, depth=12))[0]
    assert [h.source for h in hits][0] == 1 and hits[0].unit == 4
    assert sorted(h.source for h in hits) == [0, 1, 2, 3]


@pytest.mark.parametrize("engine", ["numpy", "faiss-flat", "faiss-hnsw"])
def test_codes_are_held_once_and_follow_every_add(engine):
    rng = np.random.default_rng(15)
    first, second = unit_rows(rng, 7, 8), unit_rows(rng, 500, 8)
    model = model_for(np.vstack([first, second]), bits=16)
    index = HashIndex(model, engine)
    index.add(first)
    index.add(second)  # FAISS's storage grows (and may move) here
    np.testing.assert_array_equal(index.codes, model.codes(np.vstack([first, second])))
    if engine != "numpy":
        assert not index.codes.flags.owndata  # a view of FAISS's storage, not a second copy
    assert index.nbytes() == index.codes.nbytes + index.sources.nbytes


def test_add_checks_lengths():
    rng = np.random.default_rng(8)
    index = HashIndex(model_for(unit_rows(rng, 10, 8), bits=16))
    with pytest.raises(ValueError, match="sources"):
        index.add(unit_rows(rng, 3, 8), sources=[0, 1])
    index.add(unit_rows(rng, 3, 8), keep_vectors=False)
    with pytest.raises(ValueError, match="keep_vectors"):
        index.add(unit_rows(rng, 3, 8), keep_vectors=True)


def test_unknown_engine_is_an_error():
    with pytest.raises(HashIndexError, match="unknown hash engine 'annoy'"):
        HashIndex(model_for(unit_rows(np.random.default_rng(0), 10, 8), bits=16), "annoy")


# ----- the index file -----

def test_save_and_load_round_trip(tmp_path):
    rng = np.random.default_rng(9)
    database = unit_rows(rng, 100, 16)
    index = HashIndex(model_for(database, bits=64, embedder="mini"), "numpy", metadata={"texts": ["a"] * 100})
    index.add(database, sources=np.arange(100) // 2)
    path = tmp_path / "index.hidx"
    index.save(path)
    loaded = HashIndex.load(path, embedder="mini", bits=64)
    assert isinstance(loaded.vectors, np.memmap)
    assert loaded.metadata == {"texts": ["a"] * 100}
    np.testing.assert_array_equal(loaded.codes, index.codes)
    np.testing.assert_array_equal(loaded.sources, index.sources)
    queries = unit_rows(rng, 4, 16)
    settings = SearchSettings(alpha=30, depth=10)
    assert loaded.search(queries, 5, settings) == index.search(queries, 5, settings)
    assert HashIndex.load(path, engine="faiss-flat").search(queries, 5, settings) == index.search(queries, 5, settings)


def test_load_checks_embedder_code_length_and_file(tmp_path):
    rng = np.random.default_rng(10)
    index = HashIndex(model_for(unit_rows(rng, 20, 8), bits=16, embedder="mini"))
    index.add(unit_rows(rng, 20, 8))
    path = tmp_path / "index.hidx"
    index.save(path)
    with pytest.raises(HashIndexError, match="trained on mini vectors, not other"):
        HashIndex.load(path, embedder="other")
    with pytest.raises(HashIndexError, match="16-bit codes, the config asks for 256"):
        HashIndex.load(path, bits=256)
    with pytest.raises(HashIndexError, match="does not exist"):
        HashIndex.load(tmp_path / "missing.hidx")
    (tmp_path / "junk.hidx").write_bytes(b"not an index at all")
    with pytest.raises(HashIndexError, match="is not a hash index file"):
        HashIndex.load(tmp_path / "junk.hidx")
    data = path.read_bytes()
    (tmp_path / "short.hidx").write_bytes(data[:len(data) - 100])
    with pytest.raises(HashIndexError, match="truncated"):
        HashIndex.load(tmp_path / "short.hidx", mmap_vectors=False)


# ----- ADSH -----

def test_beta_continuation():
    assert beta_at(0) == 1.0 and beta_at(30) == pytest.approx(2.0) and beta_at(80) == pytest.approx(3.0)


def adsh_objective(codes, relaxed, similarity, gamma, query_index):
    bits = relaxed.shape[1]
    loss = ((relaxed @ codes.T - bits * similarity) ** 2).sum()
    return loss + gamma * ((codes[query_index] - relaxed) ** 2).sum()


def test_code_step_never_increases_the_objective():
    rng = np.random.default_rng(11)
    database = unit_rows(rng, 60, 8)
    query_index = rng.choice(60, 15, replace=False)
    similarity = neighbour_similarity(database, query_index, 5, negative=-1.0)
    relaxed = np.tanh(rng.standard_normal((15, 16))).astype(np.float32)
    codes = np.where(rng.random((60, 16)) > 0.5, 1.0, -1.0).astype(np.float32)
    before = adsh_objective(codes, relaxed, similarity, 200.0, query_index)
    after_codes = update_codes(codes, relaxed, similarity, 200.0, query_index)
    assert set(np.unique(after_codes)) <= {-1.0, 1.0}
    assert adsh_objective(after_codes, relaxed, similarity, 200.0, query_index) < before


def test_similarity_matrices():
    assert pair_similarity([[1], [0, 2]], 3).tolist() == [[0, 1, 0], [1, 0, 1]]
    assert pair_similarity([[1]], 2, negative=-1.0).tolist() == [[-1, 1]]
    database = np.eye(4, dtype=np.float32)
    database[1] = [0.9, 0.1, 0, 0]
    assert neighbour_similarity(database, np.array([0]), 2)[0].tolist() == [1, 1, 0, 0]


def test_training_on_clustered_data_beats_lsh_at_the_same_code_length():
    rng = np.random.default_rng(12)
    points, labels = clustered(rng, clusters=20, per_cluster=40, dim=64, spread=2.5)
    order = rng.permutation(len(points))
    train, held = order[:700], order[700:]
    database, queries = points[train], points[held]
    train_queries = rng.choice(len(train), 200, replace=False)
    positives = [np.flatnonzero(labels[train] == labels[train][i]).tolist() for i in train_queries]
    similarity = pair_similarity(positives, len(train))
    result = train_adsh(database, database[train_queries], similarity, "test", train_queries,
                        ADSHSettings(bits=32, outer=6, inner=3, lr=1e-3, seed=0), progress=False)
    wanted = [set(np.flatnonzero(labels[train] == labels[h]).tolist()) for h in held]
    codes_only = SearchSettings(alpha=20, depth=20, exact=False)
    ours = HashIndex(result.model)
    ours.add(database, codes=result.database_codes, keep_vectors=False)
    weight, bias = initial_layer(database, 32, "random", np.random.default_rng(0))
    lsh = HashIndex(HashModel(weight, bias, "test"))
    lsh.add(database, keep_vectors=False)
    start = HashIndex(model_for(database, bits=32))  # the PCA layer ADSH starts from
    start.add(database, keep_vectors=False)
    ours_recall = recall_at(ours, queries, wanted, 20, codes_only)
    assert ours_recall > recall_at(lsh, queries, wanted, 20, codes_only) + 0.1
    assert ours_recall > recall_at(start, queries, wanted, 20, codes_only) + 0.1
    assert result.history[-1]["loss"] < result.history[0]["loss"]


def test_training_checks_the_similarity_shape():
    rng = np.random.default_rng(13)
    with pytest.raises(ValueError, match="similarity is"):
        train_adsh(unit_rows(rng, 10, 4), unit_rows(rng, 3, 4), np.zeros((3, 9)), "test", progress=False)


# ----- propositions and the pipeline -----

def test_sentence_units_join_short_sentences_and_cut_long_ones():
    text = "Yes. It rained on Monday in Paris. No. Short. " + "A very long sentence " * 30 + "."
    units = sentence_units(text, min_chars=20, max_chars=100)
    assert units[0] == "Yes. It rained on Monday in Paris."
    assert units[1].startswith("No. Short. A very long") and len(units[1]) == 100
    assert sentence_units("Tiny. End.", 20, 100) == ["Tiny. End."]
    assert sentence_units("", 20, 100) == []


def test_config_needs_a_model_and_a_known_engine(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("references:\n  retriever: hash\n")
    with pytest.raises(ConfigError, match="references.hash.model"):
        load_config(path)
    path.write_text("references:\n  hash:\n    engine: annoy\n")
    with pytest.raises(ConfigError, match="'references.hash.engine' is 'annoy'"):
        load_config(path)
    path.write_text("references:\n  retriever: sparse\n")
    with pytest.raises(ConfigError, match="'references.retriever' is 'sparse'; one of"):
        load_config(path)


@pytest.fixture
def hash_config(cpu_config, sample_examples, tmp_path):
    """cpu_config with HASH-RAG retrieval: a PCA-started layer over the test embedder's vectors of the sample."""
    embedder = HashEmbedder()
    texts = [e["query"] for e in sample_examples] + [p["page_snippet"] for e in sample_examples
                                                     for p in e["search_results"]]
    index = HashIndex(model_for(embedder.encode(texts), bits=64, embedder=embedder.name))
    index.save(tmp_path / "layer.hidx")
    cpu_config.references.retriever = "hash"
    hash_settings(cpu_config).model = str(tmp_path / "layer.hidx")
    return cpu_config


def test_hybrid_with_the_hash_index_answers_through_pgcc(make_system, hash_config, sample_examples):
    hash_config.prompts = {"reasoning": "prompts/pgcc.yaml"}

    def pgcc(conversation):
        user = conversation[1]["content"]
        return "===START===\n## Answer: christopher nolan\n## False Premise: no\n===END===" if (
            "directed by Christopher Nolan" in user.split("### Source documents")[0]) else "## Answer: i don't know"

    llm = ScriptedLLM(by_prompt(reasoning=pgcc))  # the reasoning prompt, from the PGCC file
    system = make_system(llm)
    assert system.batch_generate_answer(to_batch(sample_examples[:1])) == ["christopher nolan"]
    user = llm.calls[0][0][0][1]["content"]
    assert user.index("### Key propositions") < user.index("### Source documents") < user.index("### Question")
    assert "(id " in user and "from [1] " in user


def test_hash_retrieval_fills_propositions_from_chosen_references(hash_config, sample_examples):
    state = run_references(hash_config, ScriptedLLM(), sample_examples[0])
    assert state.references and len(state.reference_vectors) == len(state.references)
    assert 0 < len(state[PROPOSITIONS]) <= hash_settings(hash_config).propositions
    for prop in state[PROPOSITIONS]:
        reference: Reference = state.references[prop.reference - 1]
        assert prop.text in reference.text and prop.page_name == reference.page_name
    scores = [r.score for r in state.references if r.kind != "table"]
    assert scores == sorted(scores, reverse=True)


def run_references(config, llm, example):
    from models.stages.references import ReferencesStage
    from models.stages.stage import run_alone
    from utils.web_pages import PageProcessor, PageSettings

    model = HashIndex.load(hash_settings(config).model).model
    state = QueryState(0, "q0", example["query"], example["query_time"], example["search_results"])
    processor = PageProcessor(PageSettings.from_config(config.references), workers=1)
    resources = {"llm": llm, "embedder": HashEmbedder(), "pages": processor, "hash_model": model}
    run_alone(ReferencesStage(), [state], config, resources, seconds=60)
    return state


def test_read_propositions_strips_bullets_and_empty_lines():
    output = "- Inception is a 2010 film.\n\n* Nolan directed Inception.\n2) It cost $160 million.\n---\n"
    assert read_propositions(output) == ["Inception is a 2010 film.", "Nolan directed Inception.",
                                         "It cost $160 million."]


def test_llm_propositions_index_the_best_chunks(hash_config, sample_examples):
    hash_settings(hash_config).units = "llm"
    hash_settings(hash_config).llm_chunks = 2
    fact = "Christopher Nolan is the director of the film Inception."
    llm = ScriptedLLM(by_prompt(propositions=lambda conv: f"- {fact}\n- Inception premiered in July 2010."))
    state = run_references(hash_config, llm, sample_examples[0])
    (conversations, params), = llm.calls
    assert len(conversations) == 2 and params.max_tokens == hash_settings(hash_config).llm_max_tokens
    assert "Page: " in conversations[0][1]["content"]
    assert state[PROPOSITIONS][0].text == fact  # the LLM's proposition matches the question best


def test_llm_propositions_are_recorded_on_the_query_of_their_chunk(make_system, hash_config, sample_examples):
    hash_settings(hash_config).units = "llm"
    hash_settings(hash_config).llm_chunks = 2
    hash_config.record_prompts = True
    llm = ScriptedLLM(by_prompt(propositions="- Inception is a 2010 film."))
    system = make_system(llm)
    batch = to_batch(sample_examples[:2])
    result = system.answer_batch(batch)
    (sent, _), *_ = llm.calls
    recorded = []
    for trace, pages in zip(result.trace, batch["search_results"]):
        mine = [p for p in trace["prompts"] if p["prompt"] == "propositions"]
        assert len(mine) == 2 and all(p["stage"] == "references" for p in mine)
        names = {page["page_name"] for page in pages}
        assert all(p["messages"][1]["content"].split("Page: ")[1].splitlines()[0] in names for p in mine)
        recorded += [p["messages"] for p in mine]
    assert recorded == [list(c) for c in sent]


def test_failed_proposition_extraction_falls_back_to_sentences(hash_config, sample_examples, caplog_loguru):
    hash_settings(hash_config).units = "llm"

    def broken(conversation):
        raise RuntimeError("backend down")

    state = run_references(hash_config, ScriptedLLM(broken), sample_examples[0])
    assert state.references and state[PROPOSITIONS]
    assert all(p.text in state.references[p.reference - 1].text for p in state[PROPOSITIONS])
    assert "proposition extraction failed, chunks are split into sentences: backend down" in caplog_loguru.text


def test_hash_model_for_another_embedder_fails_at_load(make_system, hash_config, tmp_path):
    rng = np.random.default_rng(14)
    index = HashIndex(model_for(unit_rows(rng, 20, 512), bits=16, embedder="all-MiniLM-L6-v2"))
    index.save(tmp_path / "other.hidx")
    hash_settings(hash_config).model = str(tmp_path / "other.hidx")
    with pytest.raises(HashIndexError, match="trained on all-MiniLM-L6-v2 vectors, not hash-512"):
        make_system()


def test_propositions_survive_the_tuning_cache(hash_config, sample_examples):
    import json

    from evaluation.stage_cache import state_from_json, state_to_json

    state = run_references(hash_config, ScriptedLLM(), sample_examples[0])
    restored = state_from_json(json.loads(json.dumps(state_to_json(state))), state.pages)
    assert restored[PROPOSITIONS] == state[PROPOSITIONS] and restored[PROPOSITIONS]


def test_the_break_even_size_lies_between_the_sizes_either_side_of_it():
    from benchmarks.hash import break_even

    # ours 5x slower at 10^3, 10x faster at 10^5: equal speed at 10^(3 + 2 * log 5 / log 50)
    line = break_even([(100_000, 10.0, 1.0), (1_000, 0.1, 0.5)])
    assert f"N={10 ** (3 + 2 * np.log(5) / np.log(50)):,.0f} (slower at 1000, faster at 100000)" in line
    assert "exact search was faster at every size" in break_even([(1_000, 0.1, 0.5), (10_000, 1.0, 2.0)])
    assert "faster already at the smallest size, N=1000" in break_even([(1_000, 0.6, 0.5)])
