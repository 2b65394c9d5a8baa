"""The LLM judge against a real `transformers serve` process (SmolLM2), and against a server that is down."""

import pytest

from evaluation.judge import CORRECT, UNJUDGED, WRONG, Item, LLMJudge
from local_evaluation import build_judge
from models.config import OpenAIConfig
from models.llm.base import BackendUnavailable
from models.llm.openai import OpenAIBackend
from models.prompting import PromptLibrary
from tests.integration.conftest import _free_port
from utils.cache import CACHE_ENV

ITEMS = [Item("who directed the movie inception?", "christopher nolan", (), "It was directed by Christopher Nolan"),
         Item("which country won the 2018 fifa world cup?", "france", (), "Croatia won it"),
         Item("how many days are in a leap year?", "366", (), "three hundred and sixty-six")]


def test_served_judge_parses_caches_and_never_guesses(served_model, tmp_path, monkeypatch):
    base_url, model, log = served_model
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    judge = build_judge(base_url, model)
    before = log.read_text().count("POST /v1/chat/completions")
    first = judge.judge(ITEMS)
    asked = log.read_text().count("POST /v1/chat/completions") - before
    assert all(v in (CORRECT, WRONG, UNJUDGED) for v in first) and asked >= len(ITEMS)
    by_llm = [i for i, (v, item) in enumerate(zip(first, ITEMS))  # the rules' fallback verdicts are not cached
              if v != UNJUDGED and not judge.reasons[judge.key(item)].startswith("rules-fallback")]
    again = build_judge(base_url, model)  # a fresh judge: only the cache remembers
    before = log.read_text().count("POST /v1/chat/completions")
    second = again.judge(ITEMS)
    assert [second[i] for i in by_llm] == [first[i] for i in by_llm]
    asked_again = log.read_text().count("POST /v1/chat/completions") - before
    assert asked_again <= 1 + (len(ITEMS) - len(by_llm)) * 3  # the probe, and what the cache does not hold


def test_a_judge_server_that_is_not_there_stops_the_build_and_one_gone_later_leaves_unjudged(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    url = f"http://127.0.0.1:{_free_port()}/v1"
    with pytest.raises(BackendUnavailable, match="no server answers"):
        build_judge(url, "nobody")
    judge = LLMJudge(OpenAIBackend(OpenAIConfig(base_url=url, model="nobody", max_retries=0)),
                     PromptLibrary().get("judge"), "gone")  # as if the server went down after the probe
    items = [Item(i.query, i.answer, (), "Lyon") for i in ITEMS]  # nothing the rules' fallback could read
    assert judge.judge(items) == [UNJUDGED] * len(items)
