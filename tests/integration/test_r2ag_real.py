"""R2AG with the real models: exact embedding injection in SmolLM2, the training tool, the pipeline in both modes."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from models.config import REPO_ROOT, HFConfig
from models.gate.answer_gate import gate_settings
from models.llm import hf
from models.llm.backend import GenParams
from models.llm.hf import HFBackend
from models.llm.profile import ModelProfile, load_profile
from models.loading import load_config
from models.retrieval.r2former_head import load_checkpoint
from models.system import CragSystem
from tests.conftest import SAMPLE, to_batch
from tests.integration.conftest import same_llm, unhurried
from tools.train_r2former import main as train_main


@pytest.fixture(scope="module")
def llm() -> HFBackend:
    """Its own backend: adding the placeholder token must not change the session's shared one. The module's
    pipelines and the --lm training run on it too."""
    return HFBackend(HFConfig())


@pytest.fixture
def tools_share_the_r2ag_llm(monkeypatch, llm) -> None:
    """tools/train_r2former.py --lm builds an HFBackend of its config and profile: the module's, where that is the
    embedded default."""
    build = hf.HFBackend

    def backend(config: HFConfig, profile: ModelProfile | None = None) -> HFBackend:
        return llm if same_llm(config, profile or load_profile()) else build(config, profile)

    monkeypatch.setattr(hf, "HFBackend", backend)


def conversations(placeholder: str) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"[1] similarity: {placeholder} Paris is the capital of France.\n"
                                         f"[2] similarity: {placeholder} Berlin is in Germany.\nCapital of France?"}],
            [{"role": "user", "content": f"[1] similarity: {placeholder} Inception was directed by Nolan. Who?"}]]


def own_embeddings(llm: HFBackend, counts: list[int]) -> list[np.ndarray]:
    """For each conversation, the placeholder token's own input embedding once per placeholder."""
    token = llm.tokenizer.convert_tokens_to_ids(llm.retrieval_placeholder())
    row = llm.model.get_input_embeddings().weight[token].detach().numpy()
    return [np.stack([row] * n) for n in counts]


def test_injecting_the_placeholders_own_embedding_gives_the_same_logits(llm):
    convs = conversations(llm.retrieval_placeholder())
    plain = llm._encode(convs, None)  # left-padded batch of two lengths
    injected = llm._encode(convs, own_embeddings(llm, [2, 1]))
    assert set(injected) == {"inputs_embeds", "attention_mask"}
    with torch.no_grad():
        torch.testing.assert_close(llm.model(**plain).logits, llm.model(**injected).logits, rtol=0, atol=0)


def test_injected_generation_equals_plain_generation(llm):
    convs = conversations(llm.retrieval_placeholder())
    params = GenParams(max_tokens=16)
    assert llm.generate_with_embeddings(convs, own_embeddings(llm, [2, 1]), params) == llm.generate(convs, params)


def test_other_embeddings_change_the_output_distribution(llm):
    convs = conversations(llm.retrieval_placeholder())[:1]
    other = [np.random.default_rng(0).normal(scale=0.5, size=(2, llm.hidden_size)).astype(np.float32)]
    with torch.no_grad():
        own = llm.model(**llm._encode(convs, own_embeddings(llm, [2]))).logits
        changed = llm.model(**llm._encode(convs, other)).logits
    assert not torch.allclose(own[:, -1], changed[:, -1])


def test_a_cut_prompt_keeps_the_embeddings_of_the_placeholders_that_stay(llm):
    placeholder = llm.retrieval_placeholder()
    middle = " ".join(f"[{i}] similarity: {placeholder} filler text number {i}." for i in range(40))
    conversation = [{"role": "user", "content": f"[A] {placeholder} head. {middle} [Z] {placeholder} tail?"}]
    rows = np.arange(42, dtype=np.float32)[:, None].repeat(llm.hidden_size, axis=1)
    cut = HFBackend.__new__(HFBackend)
    cut.__dict__.update(llm.__dict__, profile=replace(llm.profile, prompt_tokens=120))
    ids, kept = cut.prompt_ids(conversation, rows)
    token = llm.tokenizer.convert_tokens_to_ids(placeholder)
    assert len(ids) == 120 and ids.count(token) == len(kept) < 42
    assert kept[0, 0] == 0 and kept[-1, 0] == 41  # the head's first and the tail's last survive
    with pytest.raises(ValueError, match="2 embeddings"):
        llm.prompt_ids(conversation, rows[:2])


def pairs_file(path, examples) -> str:
    """Reference lists from data/ questions: each gold answer in one short reference among distractors."""
    with path.open("w") as handle:
        for e in examples:
            refs = [f"{e['answer']} is the answer to: {e['query']}", "The weather was mild that year.",
                    "Many films were released in 2010.", "Stocks moved little on Friday."]
            handle.write(json.dumps({"query": e["query"], "references": refs, "labels": [1, 0, 0, 0],
                                     "answer": e["answer"]}) + "\n")
    return str(path)


def system_for(checkpoint, mode, tmp_path, llm: HFBackend, embedder) -> CragSystem:
    config = unhurried(load_config(REPO_ROOT / "configs" / "cpu.yaml"))
    config.attributes.method = "none"
    config.knowledge.enabled = config.calculator.enabled = False
    config.references.workers = 1
    config.references.cache_dir = str(tmp_path / "cache")
    r2ag = config.section("r2ag")
    r2ag.enabled, r2ag.checkpoint, r2ag.mode = True, str(checkpoint), mode
    config.reasoning.max_tokens, config.reasoning.max_reference_chars = 32, 1500  # R2AG's plumbing, not the answer
    gate_settings(config).gate = None  # fit on the shipped reasoning settings, which this changes
    return CragSystem(config, llm=llm, embedder=embedder)


def test_qdm_training_on_crag_data_serves_relevance_mode(tmp_path, capsys, sample_examples, llm, embedder,
                                                         builders_share_the_embedder):
    out = tmp_path / "qdm.pt"
    assert train_main(["--data", str(SAMPLE), "--out", str(out), "--epochs", "3"]) == 0
    printed = capsys.readouterr().out
    assert "13 lists" in printed and "val AUC" in printed and f"saved {out}" in printed
    checkpoint = load_checkpoint(out)
    assert checkpoint.embedder == "all-MiniLM-L6-v2" and not checkpoint.trained_with_lm
    system = system_for(out, "relevance", tmp_path, llm, embedder)
    try:
        result = system.answer_batch(to_batch(sample_examples[:2]))
        answers = result.answers
    finally:
        system.close()
    assert len(answers) == 2 and all(isinstance(a, str) and a for a in answers)
    assert [r["status"] for r in result.trace[0]["stages"] if r["stage"] == "r2ag"] == ["ok"]


def test_lm_training_serves_retrieval_aware_prompting(tmp_path, capsys, sample_examples, llm, embedder, monkeypatch,
                                                      builders_share_the_embedder, tools_share_the_r2ag_llm):
    out = tmp_path / "lm.pt"
    data = pairs_file(tmp_path / "lists.jsonl", sample_examples[:6])
    assert train_main(["--data", data, "--out", str(out), "--epochs", "1", "--lm", "--batch-size", "4"]) == 0
    assert "LM loss through SmolLM2" in capsys.readouterr().out
    assert load_checkpoint(out, llm_hidden_size=576).trained_with_lm
    system = system_for(out, "prompt", tmp_path, llm, embedder)
    calls = []
    original = llm.generate_with_embeddings
    monkeypatch.setattr(llm, "generate_with_embeddings", lambda c, e, p: (calls.append(e), original(c, e, p))[1])
    try:
        answers = system.batch_generate_answer(to_batch(sample_examples[:1]))
    finally:
        system.close()
    assert system.resource("r2former").prompting and len(answers) == 1 and answers[0]
    assert len(calls) == 1 and calls[0][0].shape[1] == 576 and len(calls[0][0]) > 0


def test_training_tool_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q", "references": ["a", "b"], "labels": [1]}) + "\n")
    assert train_main(["--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}:1: needs a query string")
    assert train_main(["--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such data file" in capsys.readouterr().err
