"""R2AG: retrieval features, the R2-Former, its training, checkpoints, and the r2ag stage in the pipeline."""

import json
import math

import numpy as np
import pytest
import torch

from models.config import ConfigError
from models.loading import load_config
from models.prompting import Messages
from models.retrieval.r2former_head import (
    R2Former,
    R2FormerConfig,
    R2FormerError,
    R2FormerHead,
    load_checkpoint,
    pad_lists,
    retrieval_features,
    save_checkpoint,
)
from models.stages.r2ag import RETRIEVAL_FEATURES, relevance_order
from models.stages.reasoning import fit_references, place_embeddings
from models.state import QueryState, Reference
from tests.conftest import to_batch, write
from tests.fakes import SEED_REPLY, ScriptedLLM
from tools import train_r2former
from training.r2former_training import (
    FoldRecall,
    RankedList,
    TrainSettings,
    evaluate,
    hit_at,
    query_folds,
    split,
    synthetic_lists,
    train,
)

PLACEHOLDER = "<|retrieval|>"


def test_features_on_a_hand_computed_example():
    query = np.array([2.0, 0.0])  # not unit length: features normalise
    docs = np.array([[1.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    feats = retrieval_features(query, docs)
    w1 = math.e / (math.e + 1)  # softmax(r1 = 1, r2 = 0)
    mixed = np.array([w1, 1 - w1])
    gamma3 = (mixed @ np.array([1, 1]) / math.sqrt(2)) / np.linalg.norm(mixed)
    expected = [[1.0, 1.0, 0.0],                      # r1 = 1; gamma1 = 1; zeta1 = cos(d1, d2) = 0
                [0.0, 0.0, math.sqrt(0.5) / 2],       # gamma2 = cos(d2, d1); zeta2 = mean(0, cos(d2, d3))
                [math.sqrt(0.5), gamma3, math.sqrt(0.5)]]  # zeta3 = cos(d3, d2)
    np.testing.assert_allclose(feats, expected, atol=1e-6)
    assert gamma3 == pytest.approx(0.9077, abs=1e-4)


def test_features_of_one_reference_and_of_none():
    np.testing.assert_allclose(retrieval_features(np.array([1.0, 1.0]), np.array([[1.0, 0.0]])),
                               [[math.sqrt(0.5), 1.0, 1.0]], atol=1e-6)
    assert retrieval_features(np.array([1.0, 0.0]), np.zeros((0, 2))).shape == (0, 3)


def small_model(hidden_size=None, seed=0) -> R2Former:
    torch.manual_seed(seed)
    return R2Former(R2FormerConfig(hidden=32, heads=4, layers=1, dropout=0.1, max_refs=8, llm_hidden_size=hidden_size))


@pytest.mark.parametrize("lengths", [[1], [2], [1, 2, 8], [8, 3]])
def test_padding_masks_leave_real_references_unchanged(lengths):
    rng = np.random.default_rng(0)
    lists = [rng.normal(size=(n, 3)).astype(np.float32) for n in lengths]
    batch, padding = pad_lists(lists, max_refs=8)
    assert batch.shape == (len(lengths), max(lengths), 3)
    assert padding.sum(dim=1).tolist() == [max(lengths) - n for n in lengths]
    model = small_model(hidden_size=6).eval()
    with torch.no_grad():
        logits, projected = model(batch, padding)
        for row, feats in enumerate(lists):  # each list alone gives what it got beside longer ones
            alone_logits, alone_projected = model(*pad_lists([feats], max_refs=8))
            n = len(feats)
            torch.testing.assert_close(logits[row, :n], alone_logits[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(projected[row, :n], alone_projected[0], atol=1e-5, rtol=1e-5)
    assert projected.shape == (len(lengths), max(lengths), 6)


def test_lists_longer_than_max_refs_keep_their_first_references(tmp_path):
    batch, padding = pad_lists([np.ones((12, 3), dtype=np.float32)], max_refs=8)
    assert batch.shape == (1, 8, 3) and not padding.any()
    head = R2FormerHead(load_round_trip(small_model(), "hash-512", tmp_path))
    probabilities, vectors = head.run([np.ones((12, 3), dtype=np.float32)])
    assert len(probabilities[0]) == 12 and (probabilities[0][8:] == 0).all() and vectors == [None]


def test_training_on_a_synthetic_task_reaches_auc_0_9():
    train_lists, val_lists = synthetic_lists(300, seed=1), synthetic_lists(80, seed=2)
    model = small_model()
    settings = TrainSettings(epochs=12, lr=2e-3, batch_size=16, seed=0)
    before = evaluate(model, val_lists, settings, None)
    history = train(model, train_lists, val_lists, settings)
    assert history.rows[-1]["train_loss"] < history.rows[0]["train_loss"]
    after = evaluate(model, val_lists, settings, None)
    assert after["auc"] >= 0.9
    assert after["qdm"] < before["qdm"]
    assert history.rows[history.best_epoch - 1]["val_loss"] == min(r["val_loss"] for r in history.rows)


def test_split_keeps_both_sides_non_empty():
    lists = synthetic_lists(5, seed=0)
    train_part, val_part = split(lists, 0.2, seed=0)
    assert len(train_part) == 4 and len(val_part) == 1
    assert split(lists, 0.99, seed=0)[0]  # never an empty training set


def load_round_trip(model: R2Former, embedder: str, tmp_dir, **load) -> object:
    path = tmp_dir / "r2.pt"
    save_checkpoint(model, path, embedder, {"val_auc": 0.5}, trained_with_lm=model.projection is not None)
    return load_checkpoint(path, **load)


def test_checkpoint_round_trip_gives_the_same_outputs(tmp_path):
    model = small_model(hidden_size=6).eval()
    loaded = load_round_trip(model, "hash-512", tmp_path, llm_hidden_size=6)
    assert loaded.embedder == "hash-512" and loaded.trained_with_lm and loaded.metrics == {"val_auc": 0.5}
    batch = pad_lists([np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)], 8)
    with torch.no_grad():
        for a, b in zip(model(*batch), loaded.model(*batch)):
            torch.testing.assert_close(a, b)


def test_checkpoint_for_another_hidden_size_is_a_clear_error(tmp_path):
    with pytest.raises(R2FormerError, match="hidden size 6, but this LLM's is 576"):
        load_round_trip(small_model(hidden_size=6), "hash-512", tmp_path, llm_hidden_size=576)
    with pytest.raises(R2FormerError, match="reference filtering only"):
        load_round_trip(small_model(), "hash-512", tmp_path, llm_hidden_size=576)


def test_missing_and_foreign_checkpoints_are_refused(tmp_path):
    with pytest.raises(R2FormerError, match="not found"):
        load_checkpoint(tmp_path / "nothing.pt")
    with pytest.raises(R2FormerError, match="not an R2-Former checkpoint"):
        load_checkpoint(write(tmp_path / "bad.pt", "garbage"))
    torch.save({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(R2FormerError, match="not an R2-Former checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


@pytest.mark.parametrize("probs, threshold, min_keep, expected", [
    ([0.2, 0.9, 0.6, 0.1], 0.5, 1, [1, 2]),      # re-ordered, the ones under the threshold dropped
    ([0.2, 0.3, 0.1], 0.5, 2, [1, 0]),           # none pass: the best min_keep stay
    ([0.7, 0.7, 0.9], 0.5, 0, [2, 0, 1]),        # ties keep the retriever's order
    ([0.1], 0.5, 3, [0]),
    ([], 0.5, 3, []),
])
def test_relevance_order(probs, threshold, min_keep, expected):
    assert relevance_order(np.array(probs), threshold, min_keep) == expected


def test_place_embeddings_follows_the_markers_in_prompt_order():
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    conversation = Messages([{"role": "system", "content": "rules"},
                             {"role": "user", "content": f"t \ue0002\ue001 x {PLACEHOLDER} \ue0000\ue001 y"}],
                            "reasoning")
    placed, rows = place_embeddings(conversation, vectors, PLACEHOLDER)
    assert placed.prompt == "reasoning"
    assert placed[1]["content"] == f"t {PLACEHOLDER} x  {PLACEHOLDER} y"  # a placeholder from the page is dropped
    np.testing.assert_array_equal(rows, vectors[[2, 0]])
    assert place_embeddings(Messages(conversation[:1], "reasoning"), vectors, PLACEHOLDER)[1].shape == (0, 4)


def test_config_checks_r2ag(tmp_path):
    with pytest.raises(ConfigError, match="r2ag.checkpoint"):
        load_config(write(tmp_path / "a.yaml", "r2ag: {enabled: true}"))
    with pytest.raises(ConfigError, match="'r2ag.mode' is 'soft'; one of"):
        load_config(write(tmp_path / "b.yaml", "r2ag: {mode: soft}"))


# --- the r2ag stage in the pipeline (scripted LLM, hashing embedder) ---

@pytest.fixture(scope="module")
def trained_checkpoints(tmp_path_factory):
    """A QDM-only and a projection checkpoint (hidden size 6) trained on synthetic lists for the hash embedder."""
    folder = tmp_path_factory.mktemp("r2")
    paths = {}
    for name, hidden in (("qdm", None), ("prompt", 6)):
        model = small_model(hidden_size=hidden)
        train(model, synthetic_lists(200, seed=3), synthetic_lists(40, seed=4), TrainSettings(epochs=4, lr=2e-3))
        paths[name] = folder / f"{name}.pt"
        save_checkpoint(model, paths[name], "hash-512", trained_with_lm=hidden is not None)
    return paths


class EmbeddingLLM(ScriptedLLM):
    """A scripted LLM that also takes input embeddings, like the hf backend."""

    hidden_size = 6

    def __init__(self) -> None:
        super().__init__()
        self.embedded: list[tuple[list, list[np.ndarray]]] = []

    def retrieval_placeholder(self) -> str:
        return PLACEHOLDER

    def generate_with_embeddings(self, conversations, embeddings, params):
        self.embedded.append((conversations, embeddings))
        return self.generate(conversations, params)


def seen_by_reasoning(system, counts: list[int] | None = None) -> list[QueryState]:
    """The states as the reasoning stage receives them; `counts` gets how many references each had before r2ag."""
    states: list[QueryState] = []
    stages = {stage.name: stage for stage in system.pipeline}
    reasoning, r2ag = stages["reasoning"].run, stages["r2ag"].run
    stages["reasoning"].run = lambda batch, ctx: (states.extend(batch), reasoning(batch, ctx))[1]
    if counts is not None:
        stages["r2ag"].run = lambda batch, ctx: (counts.extend(len(s.references) for s in batch), r2ag(batch, ctx))[1]
    return states


def r2ag_system(make_system, cpu_config, checkpoint, mode, llm, **settings):
    cpu_config.section("r2ag").enabled = True
    cpu_config.section("r2ag").checkpoint = str(checkpoint)
    cpu_config.section("r2ag").mode = mode
    for key, value in settings.items():
        setattr(cpu_config.section("r2ag"), key, value)
    return make_system(llm)


def test_relevance_mode_reorders_and_filters_the_references(make_system, cpu_config, sample_examples,
                                                            trained_checkpoints):
    llm = ScriptedLLM()
    system = r2ag_system(make_system, cpu_config, trained_checkpoints["qdm"], "relevance", llm,
                         threshold=0.5, min_keep=2)
    before: list[int] = []
    states = seen_by_reasoning(system, before)
    result = system.answer_batch(to_batch(sample_examples[:2]))
    answers = result.answers
    assert answers == ["paris", "paris"]
    assert all(len(s.references) < count for s, count in zip(states, before))  # references were dropped
    assert [r["stage"] for r in result.trace[0]["stages"]][:2] == ["references", "r2ag"]
    for state in states:
        relevance = [r.relevance for r in state.references]
        assert relevance == sorted(relevance, reverse=True) and len(relevance) >= 2
        assert all(p >= 0.5 for p in relevance[2:])  # past min_keep, only those over the threshold stay
        assert len(state.reference_vectors) == len(state.references)
        for ref, vector in zip(state.references, state.reference_vectors):  # vectors follow their references
            np.testing.assert_allclose(vector, system.resource("embedder").encode([ref.embedded_as()])[0], atol=1e-6)


def test_prompt_mode_injects_one_embedding_per_reference_shown(make_system, cpu_config, sample_examples,
                                                               trained_checkpoints):
    llm = EmbeddingLLM()
    system = r2ag_system(make_system, cpu_config, trained_checkpoints["prompt"], "prompt", llm)
    states = seen_by_reasoning(system)
    assert system.batch_generate_answer(to_batch(sample_examples[:2])) == ["paris", "paris"]
    (conversations, embeddings), = llm.embedded
    for state, conversation, rows in zip(states, conversations, embeddings):
        np.testing.assert_allclose(state[RETRIEVAL_FEATURES],
                                   retrieval_features(state.query_vector, state.reference_vectors), atol=1e-6)
        _, (projected,) = system.resource("r2former").run([np.asarray(state[RETRIEVAL_FEATURES], dtype=np.float32)])
        shown = fit_references(state.references, cpu_config.reasoning.max_reference_chars)
        embedded = min(len(shown), system.resource("r2former").model.config.max_refs)  # the rest are shown without one
        order = [i for i, r in enumerate(shown) if r.kind != "table" and i < embedded] + [
            i for i, r in enumerate(shown) if r.kind == "table" and i < embedded]
        user = conversation[1]["content"]
        assert user.count(f"similarity: {PLACEHOLDER}") == user.count(PLACEHOLDER) == embedded == len(rows)
        assert "\ue000" not in user
        np.testing.assert_allclose(rows, projected[order], atol=1e-6)  # the template's order: texts, then tables


def test_prompt_mode_records_the_conversations_sent_with_embeddings(make_system, cpu_config, sample_examples,
                                                                   trained_checkpoints):
    cpu_config.record_prompts = True
    llm = EmbeddingLLM()
    system = r2ag_system(make_system, cpu_config, trained_checkpoints["prompt"], "prompt", llm)
    result = system.answer_batch(to_batch(sample_examples[:2]))
    (conversations, _), = llm.embedded
    for trace, conversation in zip(result.trace, conversations):
        # the reply as a backend generates it: cut before the stop string the reasoning stage sends
        assert trace["prompts"] == [{"stage": "reasoning", "prompt": "reasoning", "messages": list(conversation),
                                     "replies": [SEED_REPLY.removesuffix("===END===").strip()]}]
        assert PLACEHOLDER in trace["prompts"][0]["messages"][1]["content"]  # as the backend saw it


def test_prompt_mode_without_an_embedding_backend_filters_instead(make_system, cpu_config, sample_examples,
                                                                  trained_checkpoints, caplog_loguru):
    llm = ScriptedLLM()
    system = r2ag_system(make_system, cpu_config, trained_checkpoints["qdm"], "prompt", llm)
    assert "cannot take input embeddings" in caplog_loguru.text
    assert not system.resource("r2former").prompting
    assert system.batch_generate_answer(to_batch(sample_examples[:1])) == ["paris"]
    assert "\ue000" not in llm.calls[0][0][0][1]["content"]


def test_prompt_mode_refuses_a_checkpoint_for_another_hidden_size(make_system, cpu_config, trained_checkpoints):
    llm = EmbeddingLLM()
    llm.hidden_size = 576
    with pytest.raises(R2FormerError, match="hidden size 6"):
        r2ag_system(make_system, cpu_config, trained_checkpoints["prompt"], "prompt", llm)


def test_a_checkpoint_of_another_embedder_is_refused(make_system, cpu_config, trained_checkpoints, tmp_path):
    model = load_checkpoint(trained_checkpoints["qdm"]).model
    save_checkpoint(model, tmp_path / "minilm.pt", "all-MiniLM-L6-v2")
    with pytest.raises(R2FormerError, match="trained on all-MiniLM-L6-v2 embeddings, but the embedder is hash-512"):
        r2ag_system(make_system, cpu_config, tmp_path / "minilm.pt", "relevance", ScriptedLLM())


def test_references_without_embeddings_are_left_as_ranked(trained_checkpoints, cpu_config, caplog_loguru):
    from models.stages.r2ag import R2AGStage
    from models.stages.stage import run_alone

    state = QueryState(0, "q0", "who?", "", [], [Reference("a", "chunk"), Reference("b", "chunk")])
    head = R2FormerHead(load_checkpoint(trained_checkpoints["qdm"]))
    run_alone(R2AGStage(), [state], cpu_config, {"r2former": head}, seconds=60)
    assert [r.text for r in state.references] == ["a", "b"] and "carry no embeddings" in caplog_loguru.text


def test_query_folds_keep_each_question_in_one_fold():
    lists = synthetic_lists(23, seed=0)
    lists += [RankedList(item.state, item.labels, item.features) for item in lists[:5]]  # a question's second list
    parts = query_folds(lists, 4, seed=3)
    assert sorted(i for part in parts for i in part) == list(range(len(lists)))
    fold_of = {}
    for fold, part in enumerate(parts):
        for index in part:
            assert fold_of.setdefault(lists[index].state.interaction_id, fold) == fold
    assert {len({lists[i].state.interaction_id for i in part}) for part in parts} == {5, 6}


def test_fold_recall_counts_hits_of_both_orders():
    recall = FoldRecall((1, 2))
    recall.add(0, np.array([False, True, False]), np.array([0.1, 0.9, 0.2]))  # R2-Former lifts the positive
    recall.add(1, np.array([True, False]), np.array([0.0, 1.0]))  # and buries this one
    recall.add(2, np.array([False, False]), np.array([1.0, 0.0]))  # no positive: not counted
    assert recall.lists == [0, 1]
    assert recall.hits == {"dense": {1: [False, True], 2: [True, True]},
                           "r2former": {1: [True, False], 2: [True, True]}}
    assert hit_at(np.array([2, 0, 1]), np.array([False, False, True]), 1)


def test_cross_validation_trains_each_fold_without_its_questions(tmp_path, monkeypatch, capsys):
    lists = synthetic_lists(60, seed=4)
    trained_on: list[set[str]] = []

    def recording_train(model, fit, val, settings, lm=None, progress=False):
        trained_on.append({item.state.interaction_id for item in [*fit, *val]})
        return train(model, fit, val, settings, lm)

    monkeypatch.setattr(train_r2former, "train", recording_train)
    out = tmp_path / "r2.pt"
    args = train_r2former.parse_args(["--data", "lists.jsonl", "--out", str(out), "--folds", "3", "--epochs", "4",
                                      "--hidden", "32", "--max-refs", "8", "--lr", "2e-3", "--k", "1", "3"])
    assert train_r2former.cross_validate(args, lists, None, "fake-embedder") == 0
    summary = json.loads((tmp_path / "r2.folds.json").read_text())
    held = [set(fold["interaction_ids"]) for fold in summary["folds"]]
    assert set().union(*held) == {item.state.interaction_id for item in lists}
    assert all(not (h & t) and h | t == held[0] | held[1] | held[2] for h, t in zip(held, trained_on))
    for fold, entry in enumerate(summary["folds"]):
        checkpoint = load_checkpoint(tmp_path / entry["checkpoint"])
        assert entry["checkpoint"] == f"r2.fold{fold}.pt" and checkpoint.embedder == "fake-embedder"
    with_positive = [item for item in lists if item.labels.any()]
    assert summary["lists_with_positive"] == len(with_positive)
    dense_at_1 = np.mean([bool(item.labels[0]) for item in with_positive])
    (first, third) = summary["recall"]
    assert first["k"] == 1 and first["dense"] == pytest.approx(dense_at_1)
    assert first["difference"] == pytest.approx(first["r2former"] - first["dense"])
    assert first["ci95"][0] <= first["difference"] <= first["ci95"][1]
    assert third["dense"] >= first["dense"] and third["r2former"] >= first["r2former"]
    printed = capsys.readouterr().out
    assert f"{len(with_positive)} of 60 lists hold one" in printed and f"{first['dense']:.3f}" in printed
