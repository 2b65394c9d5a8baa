"""The LLM judge against a real `transformers serve` process (SmolLM2), and against a server that is down."""

from evaluation.judge import CORRECT, UNJUDGED, WRONG, Item
from local_evaluation import build_judge
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
    judged = [i for i, v in enumerate(first) if v != UNJUDGED]
    again = build_judge(base_url, model)  # a fresh judge: only the cache remembers
    before = log.read_text().count("POST /v1/chat/completions")
    second = again.judge(ITEMS)
    assert [second[i] for i in judged] == [first[i] for i in judged]
    asked_again = log.read_text().count("POST /v1/chat/completions") - before
    assert asked_again <= (len(ITEMS) - len(judged)) * 3  # cached verdicts are not asked again


def test_judge_server_down_leaves_everything_unjudged(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    judge = build_judge(f"http://127.0.0.1:{_free_port()}/v1", "nobody")
    judge.llm.config.max_retries = 0
    assert judge.judge(ITEMS) == [UNJUDGED] * len(ITEMS)
