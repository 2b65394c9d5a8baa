"""HASH-RAG with the real embedder: tools/train_hash.py on data/ and on a pairs file, its index serving the
pipeline's hash retriever (and the PGCC prompt with the real SmolLM2), and its one-line errors."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from models.config import REPO_ROOT
from models.gate.answer_gate import gate_settings
from models.loading import load_config
from models.retrieval.hash_index import HashIndex, HashModel, SearchSettings
from models.retrieval.r2former_head import R2Former, load_checkpoint
from models.stages import hash_retriever
from models.stages.hash_retriever import hash_settings
from models.system import CragSystem
from tests.conftest import to_batch
from tests.integration.conftest import unhurried
from tools import train_r2former
from tools.train_hash import main as train_main
from training.hash_training import initial_layer

SAMPLE = REPO_ROOT / "data" / "crag_sample.jsonl"


def _recorded(built: list[tuple[R2Former, dict[str, Any]]], model: R2Former) -> R2Former:
    """`model`, with a copy of its initial weights appended to `built`."""
    built.append((model, {name: value.detach().clone() for name, value in model.state_dict().items()}))
    return model


def test_training_on_crag_data_saves_a_searchable_index(tmp_path, capsys, embedder, builders_share_the_embedder,
                                                        monkeypatch):
    out = tmp_path / "crag.hidx"
    assert train_main(["--data", str(SAMPLE), "--out", str(out), "--rounds", "2", "--bits", "64"]) == 0
    printed = capsys.readouterr().out
    assert "embedder all-MiniLM-L6-v2" in printed and "LSH 64 bits" in printed and f"saved {out}" in printed
    index = HashIndex.load(out, embedder="all-MiniLM-L6-v2", bits=64)
    texts = index.metadata["texts"]
    assert len(texts) == len(index) > 20
    query = embedder.encode(["who directed the movie inception?"])
    hits = index.search(query, 3, SearchSettings(alpha=50, depth=20))[0]
    assert any("Nolan" in texts[hit.unit] for hit in hits)

    # the R2-Former trains on the lists this index ranks: its weights change, and what it saves loads
    config = tmp_path / "hash.yaml"
    config.write_text(f"references: {{retriever: hash, workers: 1, hash: {{model: {out}, units: llm}}}}\n")
    ranked, built = [], []
    pool = hash_retriever.hash_pool
    monkeypatch.setattr(hash_retriever, "hash_pool", lambda *args: ranked.append(args[0]) or pool(*args))
    monkeypatch.setattr(train_r2former, "R2Former", lambda *args: _recorded(built, R2Former(*args)))
    checkpoint_path = tmp_path / "r2.pt"
    assert train_r2former.main(["--data", str(SAMPLE), "--config", str(config), "--out", str(checkpoint_path),
                                "--epochs", "1"]) == 0
    assert f"saved {checkpoint_path}" in capsys.readouterr().out
    assert ranked and all(np.array_equal(model.weight, index.model.weight) for model in ranked)
    checkpoint = load_checkpoint(checkpoint_path)
    assert checkpoint.embedder == "all-MiniLM-L6-v2" and not checkpoint.trained_with_lm
    assert np.isfinite(checkpoint.metrics["val_loss"]) and checkpoint.metrics["epoch"] == 1
    ((_, initial),) = built
    saved = checkpoint.model.state_dict()
    assert saved.keys() == initial.keys()
    assert any(not torch.equal(saved[name], initial[name]) for name in saved)  # one epoch of Adam moved it


def test_pairs_file_and_the_pipeline_retriever(tmp_path, capsys, sample_examples, hf_llm, embedder,
                                               builders_share_the_embedder):
    rows = [{"query": e["query"], "positives": [p["page_snippet"] for p in e["search_results"][:1]],
             "negatives": [p["page_snippet"] for p in e["search_results"][1:]]} for e in sample_examples]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "pairs.hidx"
    assert train_main(["--data", str(data), "--out", str(out), "--rounds", "2", "--no-vectors"]) == 0
    assert "13 questions (10 train, 3 held out)" in capsys.readouterr().out
    assert HashIndex.load(out).vectors is None

    config = unhurried(load_config(REPO_ROOT / "configs" / "cpu.yaml"))
    config.task, config.attributes.method = 1, "none"
    config.knowledge.enabled = config.calculator.enabled = False
    config.references.workers = 1
    config.references.cache_dir = str(tmp_path / "cache")
    config.references.retriever, hash_settings(config).model = "hash", str(out)
    config.prompts = {"reasoning": "prompts/pgcc.yaml"}
    # the prompt is under test, not the answer: a short one, and a short reply
    config.reasoning.max_tokens, config.reasoning.max_reference_chars, config.record_prompts = 32, 1500, True
    gate_settings(config).gate = None  # fit on the shipped reasoning settings, which this changes
    system = CragSystem(config, llm=hf_llm, embedder=embedder)
    try:
        result = system.answer_batch(to_batch(sample_examples[:2]))
        answers = result.answers
    finally:
        system.close()
    assert len(answers) == 2 and all(isinstance(a, str) and a for a in answers)
    for trace in result.trace:
        stages = {r["stage"]: r["status"] for r in trace["stages"]}
        assert stages["references"] == "ok" and stages["reasoning"] == "ok"
        # the PGCC prompt lists the hash index's propositions, then the references they came from
        user = next(p for p in trace["prompts"] if p["stage"] == "reasoning")["messages"][-1]["content"]
        assert "- (id " in user.split("### Key propositions", 1)[1]  # a line of prompts/pgcc.yaml
        assert trace["references"] and trace["references"][0]["text"][:200] in user


def test_training_tool_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q", "positives": []}) + "\n")
    assert train_main(["--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}:1: needs a query string")
    few = tmp_path / "few.jsonl"
    few.write_text(json.dumps({"query": "q", "positives": ["a"]}) + "\n")
    assert train_main(["--data", str(few)]) == 2
    assert "1 questions with a positive; at least 4" in capsys.readouterr().err
    assert train_main(["--data", str(SAMPLE), "--bits", "12"]) == 2
    assert "--bits must be a positive multiple of 8" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["numpy", "faiss-flat"])
def test_real_proposition_vectors_search_like_exact_cosine(embedder, engine):
    sentences = [f"Fact number {i}: the {w} of city {i % 7} is {i * 3} units." for i, w in
                 enumerate(["population", "area", "altitude", "rainfall", "budget"] * 12)]
    vectors = embedder.encode(sentences)
    weight, bias = initial_layer(vectors, 128, "pca", np.random.default_rng(0))
    index = HashIndex(HashModel(weight, bias, embedder.name), engine)
    index.add(vectors)
    query = embedder.encode(["what is the rainfall of city 3?"])[0]
    hits = index.search(query, 5, SearchSettings(alpha=len(sentences), depth=len(sentences)))[0]
    assert [h.source for h in hits] == np.argsort(-(vectors @ query), kind="stable")[:5].tolist()
