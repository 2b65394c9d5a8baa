"""UserModel end to end on the embedded default, on data/ and on real CRAG pages. The batch deadline is out of
reach (unhurried): what is asserted is what every stage did, which a busy machine must not change."""

from __future__ import annotations

import bz2
import json
import re

import pytest
import yaml

from models.config import REPO_ROOT
from models.loading import load_config
from models.stages.stage import run_alone
from models.system import CragSystem, unpack_batch
from models.user_config import UserModel
from tests.conftest import SHARED_CRAG, stage_of, to_batch, write_config
from tests.integration.conftest import UNHURRIED_S, unhurried
from utils.grader_tokens import grader_cut


@pytest.fixture(scope="module")
def user_model(hf_llm, embedder, cpu_config_module):
    system = CragSystem(cpu_config_module, llm=hf_llm, embedder=embedder)
    yield system
    system.close()


@pytest.fixture(scope="module")
def cpu_config_module(tmp_path_factory, kg_server):
    """configs/cpu.yaml as shipped (page workers included, task 2) but unhurried, with the page cache in a fresh
    folder and the fixture KG server as the mock API."""
    config = unhurried(load_config(REPO_ROOT / "configs" / "cpu.yaml"))
    config.references.cache_dir = str(tmp_path_factory.mktemp("cache"))
    config.section("kg").base_url = kg_server
    return config


def test_default_user_model_builds_from_cpu_config(monkeypatch, hf_llm, embedder, builders_share_the_llm,
                                                    builders_share_the_embedder):
    """As the grader builds it: no argument. Its models are the session's (the builders are shared), built from
    what configs/cpu.yaml names."""
    monkeypatch.delenv("CRAG_CONFIG", raising=False)
    model = UserModel()
    model.close()
    assert 1 <= model.get_batch_size() <= 16 and model.config.source.endswith("cpu.yaml")
    assert model.resource("llm") is hf_llm and model.resource("embedder") is embedder
    assert model.resource("pages") is not None
    names = {s.name for s in model.pipeline}
    assert {"attributes", "references", "reasoning"} <= names and "gate" not in names
    assert not {"knowledge", "calculator"} & names  # off in configs/cpu.yaml


def test_answers_a_batch_from_data(user_model, sample_examples):
    """Per query, the stages the shipped config runs, each "ok", and an answer the grader reads whole. Two questions
    (what is asserted holds per query); at least one must reach the LLM stages."""
    examples = sample_examples[:2]
    result = user_model.answer_batch(to_batch(examples))
    answers = result.answers
    assert len(answers) == len(examples) and all(isinstance(a, str) and a for a in answers)
    assert all(grader_cut(a) == a for a in answers)  # the grader's 75-token cut changes nothing
    gathered = ["attributes", "kg", "precheck", "references", "evidence"]  # the pre-check after the KG (task 2)
    closing = ["answer"]  # configs/cpu.yaml has no answer gate (configs/overlays/vllm-cpu.yaml has)
    reached_the_llm = 0
    for trace in result.trace:
        stages = [r["stage"] for r in trace["stages"]]
        assert all(r["status"] == "ok" for r in trace["stages"])
        if trace["reason"].startswith(("predicted", "no usable text")):  # answered "i don't know" before the LLM
            assert stages[:-1] == gathered[:len(stages) - 1] and stages[-1:] == closing
        else:
            assert stages == [*gathered, "reasoning", *closing]
            reached_the_llm += 1
    assert reached_the_llm, "no question of the batch reached the LLM stages: pick others"


def test_openai_config_sends_prompts_to_the_server(served_model, embedder, sample_examples, tmp_path, monkeypatch):
    base_url, model, log = served_model
    profile = tmp_path / "served.yaml"  # the model under the server's name, its weights the server's only
    profile.write_text(yaml.safe_dump({"name": model, "weights": None}), encoding="utf-8")
    path = write_config(tmp_path / "openai.yaml", {
        "llm": {"backend": "openai", "profile": str(profile),
                "openai": {"base_url": base_url, "request_timeout_s": UNHURRIED_S}},  # else a request is sent again
        "references": {"cache_dir": str(tmp_path / "cache"), "timeout_s": UNHURRIED_S},
        "attributes": {"method": "none"},  # no dynamic pre-check: both queries reach the LLM stages
        "knowledge": {"enabled": True},  # on, so that three stages send requests
        "calculator": {"enabled": True, "n": 1},
        "task": 1,  # no KG entity extraction: the request count below is the seed stages'
        "answer": {"gate": None},
        "budget": {"per_query_s": UNHURRIED_S}})
    monkeypatch.setenv("CRAG_CONFIG", str(path))
    before = log.read_text().count("POST /v1/chat/completions")
    system = UserModel(embedder=embedder)
    assert log.read_text().count("POST /v1/chat/completions") - before == 1  # the probe of the server
    before += 1
    answers = system.batch_generate_answer(to_batch(sample_examples[:2]))
    system.close()
    assert len(answers) == 2 and all(answers)
    requests = log.read_text().count("POST /v1/chat/completions") - before
    # knowledge, calculator and reasoning: one request per query each; the summariser one per unparsable output
    assert 6 <= requests <= 8


@pytest.mark.skipif(not SHARED_CRAG.exists(), reason="../shared/crag_sample is not present")
def test_real_crag_pages_give_each_query_references_from_its_own_pages(user_model):
    """The 25 real HTML pages of 5 CRAG dev questions through the page workers and the references stage (the
    stages after it are test_answers_a_batch_from_data's): each query's references come from its own pages, read
    beyond their snippets, best first."""
    with bz2.open(SHARED_CRAG, "rt", encoding="utf-8") as handle:
        states = unpack_batch(to_batch([json.loads(line) for line in handle]))
    run_alone(stage_of(user_model, "references"), states, user_model.config, user_model.resources)
    for state in states:
        pages = {" ".join(str(page.get("page_name") or "").split()): str(page.get("page_result") or "").lower()
                 for page in state.pages}
        assert state.references and all(r.page_name in pages for r in state.references)
        read = [r for r in state.references if r.kind != "snippet"]
        assert read and all(share_in(r.text, pages[r.page_name]) > 0.9 for r in read)  # the named page's words
        scores = [r.score for r in state.references]
        assert scores == sorted(scores, reverse=True)


def share_in(text: str, html: str) -> float:
    """The share of the words of `text` that occur in `html` (lower-cased)."""
    words = re.findall(r"[a-z]{3,}", text.lower())
    return sum(word in html for word in words) / max(len(words), 1)
