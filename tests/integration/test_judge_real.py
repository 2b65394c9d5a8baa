"""The LLM judge against a real `transformers serve` process (SmolLM2), and against a server that is down.

SmolLM2 is no judge: what it replies is not asserted. What is: the rules decide what they can without a request,
every other verdict is the one the judge's replies give (or the rules' fallback, or unjudged when no reply can be
read), and a fresh judge asks again only what the cache does not hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.judge import LLMJudge, build_judge, judge_records, parse_judgement
from evaluation.verdicts import CORRECT, MISS, UNJUDGED, WRONG, Item
from models.config import OpenAIConfig
from models.llm.backend import BackendUnavailable, Conversation, GenParams, Sample
from models.llm.openai import OpenAIBackend
from models.llm.profile import ModelProfile
from models.prompting import PromptLibrary, load_prompt
from tests.servers import free_port  # a port nothing listens on once it returns
from utils.answers import contains_answer
from utils.cache import CACHE_ENV, JsonCache, cache_root
from utils.grader_tokens import grader_cut

ITEMS = [Item("who directed the movie inception?", "christopher nolan", (), "It was directed by Christopher Nolan"),
         Item("which country won the 2018 fifa world cup?", "france", (), "Croatia won it"),
         Item("how many days are in a leap year?", "366", (), "three hundred and sixty-six")]
# A judge prompt to which SmolLM2 replies "Correct. ..." on the second item (greedy).
READABLE_PROMPT = """variables: [query, answers, prediction]
system: You are a grader. Your reply must start with the word Correct or the word Incorrect.
user: |
  Question: {{ query }}
  Ground truth: {{ answers[0] }}
  Prediction: {{ prediction }}
"""
BY_RULES = [({"query": "who directed the movie inception?", "answer": "christopher nolan", "alt_answers": [],
              "prediction": "Christopher Nolan"}, CORRECT),  # the gold answer itself
            ({"query": "which country won the 2018 fifa world cup?", "answer": "france", "alt_answers": [],
              "prediction": "I don't know."}, MISS),
            ({"query": "what year did the eiffel tower open on the moon?", "answer": "invalid question",
              "alt_answers": [], "prediction": "1889"}, WRONG)]  # a false premise the prediction does not see


def record_replies(judge: LLMJudge) -> list[tuple[Conversation, Sample]]:
    """Every (conversation, reply) the judge's backend gives, in order; a conversation without a sample is left
    out."""
    asked: list[tuple[Conversation, Sample]] = []
    generate = judge.llm.generate

    def recording(conversations: list[Conversation], params: GenParams) -> list[list[Sample]]:
        outputs = generate(conversations, params)
        asked.extend((conversation, samples[0]) for conversation, samples in zip(conversations, outputs) if samples)
        return outputs

    judge.llm.generate = recording
    return asked


def replies_about(judge: LLMJudge, item: Item, asked: list[tuple[Conversation, Sample]]) -> list[Sample]:
    conversation = judge.prompt.render(query=item.query, answers=[item.answer, *item.alt_answers],
                                       prediction=grader_cut(item.prediction))
    return [reply for asked_about, reply in asked if list(asked_about) == list(conversation)]


def expected_verdict(judge: LLMJudge, item: Item, asked: list[tuple[Conversation, Sample]]) -> str:
    """What the judge must say of `item` given its replies: the reply that says correct or incorrect (asked again
    only until one does), else correct where the gold answer is in the prediction, else unjudged."""
    replies = replies_about(judge, item, asked)
    assert 1 <= len(replies) <= 1 + judge.retries
    readable = [parse_judgement(reply.text)[0] for reply in replies]
    assert all(judged is None for judged in readable[:-1])
    if readable[-1] is not None:
        return CORRECT if readable[-1] else WRONG
    return CORRECT if contains_answer(item.prediction, [item.answer]) else UNJUDGED


def posts(log: Path) -> int:
    return log.read_text().count("POST /v1/chat/completions")


def test_served_judge_verdicts_follow_the_rules_and_its_greedy_replies(served_model, tmp_path, monkeypatch):
    """No sampled retry: the replies are the model's greedy ones, the same on every run."""
    base_url, model, log = served_model
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    judge = build_judge(base_url, model)
    judge.retries = 0
    asked = record_replies(judge)
    records = [dict(record) for record, _ in BY_RULES] + [
        {"query": i.query, "answer": i.answer, "alt_answers": [], "prediction": i.prediction} for i in ITEMS]
    before = posts(log)
    judge_records(records, judge)
    # one request a question the rules leave open: both columns ask it (no alternative answers), once
    assert posts(log) - before == len(asked) == len(ITEMS)
    for record, verdict in zip(records, [verdict for _, verdict in BY_RULES]):
        assert (record["verdict"], record["judged_by"]) == (verdict, "rules") and "judge_reason" not in record
        assert record["organisers_verdict"] == verdict
        item = Item(record["query"], record["answer"], (), record["prediction"])
        assert replies_about(judge, item, asked) == []  # the rules decided: never sent to the judge
    for record, item in zip(records[len(BY_RULES):], ITEMS):
        expected = expected_verdict(judge, item, asked)
        assert record["verdict"] == record["organisers_verdict"] == expected
        reason = judge.reasons.get(judge.key(item), "")
        assert record["judged_by"] == ("none" if expected == UNJUDGED else
                                       "rules-fallback" if reason.startswith("rules-fallback") else "llm")


def test_served_judge_verdicts_follow_readable_replies_and_only_those_are_cached(served_model, tmp_path, monkeypatch):
    """The shipped prompt gets no reply from SmolLM2 that starts with a verdict word; this one gets one, greedily
    (a wrong one: the verdict is the reply's, right or wrong). A fresh judge asks again only what was not the
    LLM's verdict."""
    base_url, model, log = served_model
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    path = tmp_path / "judge.yaml"
    path.write_text(READABLE_PROMPT)

    def fresh_judge() -> LLMJudge:
        served = ModelProfile(name=model, weights=None)  # as build_judge asks a URL's model: prompts go uncut
        return LLMJudge(OpenAIBackend(OpenAIConfig(base_url=base_url), served), load_prompt(path, "judge"),
                        f"{base_url}#{model}", JsonCache(cache_root(None) / "judge"), retries=0)

    judge = fresh_judge()
    asked = record_replies(judge)
    first = judge.judge(ITEMS)
    assert first == [expected_verdict(judge, item, asked) for item in ITEMS]
    by_llm = [n for n, item in enumerate(ITEMS) if first[n] != UNJUDGED
              and not judge.reasons[judge.key(item)].startswith("rules-fallback")]
    assert by_llm, "no greedy reply to READABLE_PROMPT starts with a verdict word: the LLM's verdicts go untested"

    again = fresh_judge()  # only the cache remembers the LLM's verdicts
    asked_again = record_replies(again)
    before = posts(log)
    second = again.judge(ITEMS)
    assert [second[n] for n in by_llm] == [first[n] for n in by_llm]
    assert posts(log) - before == len(asked_again)
    asked_items = {n for n, item in enumerate(ITEMS) if replies_about(again, item, asked_again)}
    assert asked_items == set(range(len(ITEMS))) - set(by_llm)  # the rules' fallback and unjudged are not cached


def test_a_judge_server_that_is_not_there_stops_the_build_and_one_gone_later_leaves_unjudged(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(BackendUnavailable, match="no server answers"):
        build_judge(url, "nobody")
    gone = OpenAIBackend(OpenAIConfig(base_url=url, max_retries=0), ModelProfile(name="nobody", weights=None))
    judge = LLMJudge(gone, PromptLibrary().get("judge"), "gone")  # as if the server went down after the probe
    items = [Item(i.query, i.answer, (), "Lyon") for i in ITEMS]  # nothing the rules' fallback could read
    assert judge.judge(items) == [UNJUDGED] * len(items)
