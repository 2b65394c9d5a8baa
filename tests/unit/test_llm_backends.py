"""The openai backend against fakes of the servers it talks to (tests/openai_fake.py): requests, n, stop,
log-probabilities, retries, faults and the deadline."""

import json
import math
import threading

import pytest

from models.config import OpenAIConfig
from models.llm.backend import DEADLINE, FAILED, LENGTH, BackendUnavailable, GenParams, cut_at_stop, cut_short
from models.llm.openai import OpenAIBackend
from models.llm.profile import ModelProfile
from tests.fakes import texts
from tests.openai_fake import ChatServer
from utils.time_budget import Deadline


def test_cut_at_stop():
    assert cut_at_stop("a. b ===END=== c", ["===END===", "."]) == "a"
    assert cut_at_stop("abc", []) == "abc"


@pytest.fixture
def chat_server(request):
    server = ChatServer(*getattr(request, "param", ()))
    yield server
    server.close()


def _backend(url: str, **overrides) -> OpenAIBackend:
    """The openai backend asking a server-only model "m" (no weights here: prompts go uncut)."""
    return OpenAIBackend(OpenAIConfig(base_url=url, backoff_s=0.01, **overrides), ModelProfile(name="m", weights=None))


def test_openai_sends_prompts_cuts_stop_and_uses_env_key(chat_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    out = _backend(chat_server.url).generate([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
                                             GenParams(max_tokens=5, stop=["STOP"]))
    assert texts(out) == [["a"], ["b"]]
    assert {r["auth"] for r in chat_server.requests} == {"Bearer sk-test"}
    assert chat_server.requests[0]["body"]["max_tokens"] == 5 and chat_server.requests[0]["body"]["stop"] == ["STOP"]


def test_openai_reports_a_generation_cut_at_max_tokens(chat_server):
    conversation = [[{"role": "user", "content": "one two three"}]]
    ((cut,),) = _backend(chat_server.url).generate(conversation, GenParams(max_tokens=2))
    ((whole,),) = _backend(chat_server.url).generate(conversation, GenParams(max_tokens=50))
    assert (cut.text, cut_short(cut)) == ("one two", LENGTH) and cut_short(whole) is None


def test_openai_n_as_separate_requests_or_native(chat_server):
    conversation = [[{"role": "user", "content": "a"}]]
    sampled = GenParams(n=3, temperature=0.7)
    assert texts(_backend(chat_server.url).generate(conversation, sampled)) == [["a STOP tail"] * 3]
    assert len(chat_server.requests) == 3 and {r["body"]["n"] for r in chat_server.requests} == {1}
    assert texts(_backend(chat_server.url, native_n=True).generate(conversation, sampled)) == [["a STOP tail"] * 3]
    assert len(chat_server.requests) == 4 and chat_server.requests[-1]["body"]["n"] == 3


def test_native_n_against_servers_that_refuse_or_ignore_it_is_said(caplog_loguru):
    """vLLM refuses n > 1 with greedy sampling (HTTP 400); transformers serve ignores n and answers once."""
    vllm, transformers = ChatServer(kind="vllm"), ChatServer(kind="transformers")
    conversation = [[{"role": "user", "content": "a"}]]
    try:
        greedy = _backend(vllm.url, native_n=True).generate(conversation, GenParams(n=3))
        ignored = _backend(transformers.url, native_n=True).generate(conversation, GenParams(n=3, temperature=0.7,
                                                                                             stop=["STOP"]))
    finally:
        vllm.close()
        transformers.close()
    assert "n must be 1 when using greedy sampling" in failures(greedy)[0] and "n must be 1" in caplog_loguru.text
    assert texts(ignored) == [["a"]] and transformers.warnings  # the server keeps the stop string; the backend cuts it
    assert "returned 1 of 3 samples" in caplog_loguru.text and "llm.openai.native_n" in caplog_loguru.text



def failures(out) -> list[str]:
    """The causes of `out`'s failed calls, where each conversation got one failed sample (Sample.failed)."""
    assert all(len(row) == 1 and row[0].finish_reason == FAILED and not row[0].text for row in out), out
    return [row[0].failure for row in out]

@pytest.mark.parametrize("chat_server", [(2, 503)], indirect=True)
def test_openai_retries_transient_errors(chat_server):
    out = _backend(chat_server.url, max_retries=3).generate([[{"role": "user", "content": "a"}]], GenParams())
    assert texts(out) == [["a STOP tail"]] and len(chat_server.requests) == 3


@pytest.mark.parametrize("chat_server", [(5, 503)], indirect=True)
def test_openai_gives_up_after_bounded_retries(chat_server):
    out = _backend(chat_server.url, max_retries=2).generate([[{"role": "user", "content": "a"}]], GenParams())
    assert failures(out) == ["InternalServerError: Error code: 503 - try later after 3 attempts"]
    assert len(chat_server.requests) == 3


@pytest.mark.parametrize("chat_server", [(5, 400)], indirect=True)
def test_openai_does_not_retry_a_bad_request(chat_server):
    out = _backend(chat_server.url, max_retries=3).generate([[{"role": "user", "content": "a"}]], GenParams())
    assert failures(out)[0].startswith("refused (BadRequestError") and len(chat_server.requests) == 1


def test_an_unreachable_server_is_a_failed_call_and_an_expired_deadline_a_deadline_cut(chat_server):
    backend = _backend("http://127.0.0.1:9/v1", max_retries=1)
    assert failures(backend.generate([[{"role": "user", "content": "a"}]], GenParams())) == [
        "APIConnectionError: Connection error. after 2 attempts"]
    assert cut_by_deadline(_backend(chat_server.url).generate([[{"role": "user", "content": "a"}]],
                                                              GenParams(deadline=Deadline(0)))) == 1
    assert chat_server.requests == []


@pytest.mark.parametrize("chat_server", [(10, 401)], indirect=True)
def test_a_wrong_api_key_stops_the_user_model_at_construction(chat_server, cpu_config):
    from models.system import CragSystem
    from tests.fakes import HashEmbedder

    cpu_config.llm.backend = "openai"
    cpu_config.llm.openai.base_url = chat_server.url
    with pytest.raises(BackendUnavailable, match=r"refused the API key \(HTTP 401\): set \$OPENAI_API_KEY"):
        CragSystem(cpu_config, embedder=HashEmbedder())
    assert len(chat_server.requests) == 1


def verdict_alternatives(word: str, body: dict, p: float = 0.9) -> list[tuple[str, float]]:
    """A judge fairly sure of each word: the word itself at P = p, a verdict's opposite (or "the") at 0.98 - p."""
    other = {"correct": " Incorrect", "incorrect": " Correct"}.get(word.strip(".,").lower(), "the")
    return [(word, math.log(p)), (other, math.log(0.98 - p)), ("The", math.log(0.01))]


def test_openai_returns_the_log_probabilities_a_server_offers():
    server = ChatServer(answer_with=lambda body: "Correct. same person", logprobs_with=verdict_alternatives)
    try:
        sample = _backend(server.url).generate([[{"role": "user", "content": "q"}]], GenParams(top_logprobs=2))[0][0]
        plain = _backend(server.url).generate([[{"role": "user", "content": "q"}]], GenParams())[0][0]
    finally:
        server.close()
    assert sample.text == "Correct. same person" and len(sample.top_logprobs) == 3
    assert sample.top_logprobs[0] == pytest.approx({"Correct.": math.log(0.9), " Incorrect": math.log(0.08)})
    assert sample.tokens == ("Correct.", "same", "person")
    assert sample.token_logprobs == pytest.approx((math.log(0.9),) * 3)
    assert server.requests[0]["body"]["top_logprobs"] == 2 and "logprobs" not in server.requests[1]["body"]
    assert plain.top_logprobs == plain.tokens == plain.token_logprobs == ()


def test_openai_gives_each_generated_token_s_own_log_probability_whatever_its_rank(caplog_loguru):
    """`logprobs: true` alone (no top_logprobs): content[i].logprob is the generated token's, also where a
    sampled token was not the most likely."""
    unlikely = ChatServer(answer_with=lambda body: "Incorrect",
                          logprobs_with=lambda word, body: [("Correct", -0.2), (word, -1.9)])
    ignoring = ChatServer(answer_with=lambda body: "Incorrect", kind="transformers")
    try:
        (sample,), = _backend(unlikely.url).generate([[{"role": "user", "content": "q"}]],
                                                     GenParams(temperature=0.7, logprobs=True))
        (ignored,), = _backend(ignoring.url).generate([[{"role": "user", "content": "q"}]], GenParams(logprobs=True))
    finally:
        unlikely.close()
        ignoring.close()
    body = unlikely.requests[0]["body"]
    assert body["logprobs"] is True and "top_logprobs" not in body
    assert (sample.tokens, sample.token_logprobs, sample.top_logprobs) == (("Incorrect",), (-1.9,), ({},))
    assert ignored.text == "Incorrect" and ignored.tokens == ignored.token_logprobs == ()
    assert caplog_loguru.text.count("gives no log-probabilities") == 1


def test_openai_without_log_probabilities_answers_from_the_text(caplog_loguru):
    ignoring = ChatServer(answer_with=lambda body: "Correct.", kind="transformers")  # ignores the fields
    refusing = ChatServer(answer_with=lambda body: "Correct.", refuse_logprobs=True)
    try:
        ignored = _backend(ignoring.url).generate([[{"role": "user", "content": "q"}]], GenParams(top_logprobs=5))
        backend = _backend(refusing.url)
        first = backend.generate([[{"role": "user", "content": "q"}]], GenParams(top_logprobs=5))
        second = backend.generate([[{"role": "user", "content": "q"}]], GenParams(top_logprobs=5))
    finally:
        ignoring.close()
        refusing.close()
    assert texts(ignored) == texts(first) == texts(second) == [["Correct."]] and ignored[0][0].top_logprobs == ()
    assert backend.logprobs_refused and "refused log-probabilities" in caplog_loguru.text
    # refused once, asked again without; the next request does not ask for them
    assert ["logprobs" in r["body"] for r in refusing.requests] == [True, False, False]


def _completion(text: str) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}).encode()


@pytest.mark.parametrize("fault, expected_log", [
    ({"raw_body": lambda body: b"<html>502 bad gateway</html>"}, "not JSON"),
    ({"raw_body": lambda body: b'{"id": "x", "choices": "none"}'}, "no list of choices"),
    ({"raw_body": lambda body: _completion("x" * 3_000_000)}, "over 2000000 bytes"),
])
def test_openai_an_unusable_reply_costs_its_conversation_only(fault, expected_log, caplog_loguru):
    bad = ChatServer(**fault)
    try:
        out = _backend(bad.url, max_retries=0).generate([[{"role": "user", "content": "a"}]], GenParams())
    finally:
        bad.close()
    assert expected_log in failures(out)[0] and expected_log in caplog_loguru.text


def test_openai_a_reply_without_choices_or_message_is_no_sample():
    empty = ChatServer(raw_body=lambda body: b'{"id": "x", "object": "chat.completion", "choices": []}')
    odd = ChatServer(raw_body=lambda body: b'{"choices": [{"index": 0, "finish_reason": "stop"}]}')
    try:
        assert _backend(empty.url).generate([[{"role": "user", "content": "a"}]], GenParams()) == [[]]
        assert texts(_backend(odd.url).generate([[{"role": "user", "content": "a"}]], GenParams())) == [[""]]
    finally:
        empty.close()
        odd.close()


def test_a_server_failing_every_request_is_logged_once_per_call_with_the_cause(caplog_loguru):
    server = ChatServer(failures=1000, status=500)
    try:
        out = _backend(server.url, max_retries=1).generate([[{"role": "user", "content": str(i)}] for i in range(4)],
                                                           GenParams())
    finally:
        server.close()
    assert len(failures(out)) == 4 and len(server.requests) == 8  # each request tried twice
    errors = [line for line in caplog_loguru.text.splitlines() if "| ERROR" in line]
    assert len(errors) == 1 and "4 of 4 requests got no reply: InternalServerError" in errors[0]
    assert "after 2 attempts (x4)" in errors[0]


def cut_by_deadline(out) -> int:
    """How many conversations of `out` got a sample the deadline cut (DEADLINE, no text), where each got one."""
    assert all(len(row) == 1 and row[0].finish_reason == DEADLINE and not row[0].text for row in out), out
    return len(out)


@pytest.mark.parametrize("fault, retries, logged", [
    # 16 bytes every 0.5 s: each read is quick, the whole reply (about 3 KB) would take over 90 s
    ({"raw_body": lambda body: _completion("y" * 3000), "trickle_s": 0.5}, 0, "the reply was still arriving"),
    ({"hold": threading.Event()}, 2, "no reply came before it"),  # nothing at all until the test ends
], ids=["trickle", "hang"])
def test_openai_a_slow_server_is_left_at_the_deadline(fault, retries, logged, caplog_loguru):
    """The reply cannot arrive before the deadline whatever the machine's speed, so the outcome is fixed: a sample
    the deadline cut, as the in-process engines give one, not a failed call; the reason logged, no retry."""
    server = ChatServer(**fault)
    try:
        out = _backend(server.url, max_retries=retries, request_timeout_s=30).generate(
            [[{"role": "user", "content": "a"}]], GenParams(deadline=Deadline(3.0)))
    finally:
        if "hold" in fault:
            fault["hold"].set()
        server.close()
    assert cut_by_deadline(out) == 1 and len(server.requests) == 1
    assert f"1 of 1 requests cut by the batch deadline: {logged}" in caplog_loguru.text


def test_openai_a_server_slower_than_its_own_request_timeout_is_a_failed_call():
    """Where `llm.openai.request_timeout_s` ends the wait before the batch deadline would, the server is at fault:
    a failed call, which the report counts and a resume asks again."""
    hold = threading.Event()
    server = ChatServer(hold=hold)
    try:
        out = _backend(server.url, max_retries=0, request_timeout_s=1.0).generate(
            [[{"role": "user", "content": "a"}]], GenParams(deadline=Deadline(600.0)))
    finally:
        hold.set()
        server.close()
    assert failures(out) == ["APITimeoutError: Request timed out. after 1 attempts"]


