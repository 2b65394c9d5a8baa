"""Backend logic without real models: the registry, vLLM's parameter mapping, OpenAI retries and n."""

import json
import math
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from utils.deadline import Deadline
from models.config import LLMConfig, OpenAIConfig, VLLMConfig
from models.llm.base import DEADLINE, LENGTH, BackendUnavailable, GenParams, create_llm, cut_at_stop, cut_short
from models.llm.openai import OpenAIBackend


def test_cut_at_stop():
    assert cut_at_stop("a. b ===END=== c", ["===END===", "."]) == "a"
    assert cut_at_stop("abc", []) == "abc"


class FakeLLMEngine:
    """vLLM's V1 LLMEngine as `LLM.llm_engine` for the step-by-step driver. Its methods' parameters are those of
    the pinned release (tests/unit/test_vllm_engine_api.py checks them against data/vllm/engine_api-*.json). Each
    step gives every unfinished request one more word ("out"), as a cumulative RequestOutput; a request finishes
    after `words` words ("stop") or at max_tokens ("length"). `step_s` makes each step that slow."""

    def __init__(self, words: int = 3, step_s: float = 0.0) -> None:
        self.words, self.step_s = words, step_s
        self.running: dict[str, list] = {}  # request id -> [sampling params, words so far]
        self.added: list[tuple] = []
        self.aborted: list[str] = []

    def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None, tokenization_kwargs=None,
                    trace_headers=None, priority=0, prompt_text=None):
        self.added.append((request_id, prompt, params.kwargs))
        self.running[request_id] = [params, 0]

    def step(self):
        time.sleep(self.step_s)
        outputs = []
        for request_id, entry in list(self.running.items()):
            params, produced = entry[0], entry[1] + 1
            entry[1] = produced
            limit = params.kwargs["max_tokens"]
            finished = produced >= min(self.words, limit)
            # vLLM's CompletionOutput: logprobs is None unless asked for, then per token {token id: Logprob}
            logprob = types.SimpleNamespace
            steps = None if params.kwargs["logprobs"] is None else [
                {7: logprob(logprob=-0.1, rank=1, decoded_token=" out"),
                 9: logprob(logprob=-2.5, rank=2, decoded_token=" in")}] * produced
            choice = types.SimpleNamespace(text=" " + " ".join(["out"] * produced),
                                           finish_reason=("length" if produced >= limit else "stop") if finished
                                           else None, logprobs=steps)
            outputs.append(types.SimpleNamespace(request_id=request_id, finished=finished,
                                                 outputs=[choice] * params.kwargs["n"]))
            if finished:
                del self.running[request_id]
        return outputs

    def abort_request(self, request_ids, internal=False):
        self.aborted.extend(request_ids)
        for request_id in request_ids:
            self.running.pop(request_id, None)

    def has_unfinished_requests(self):
        return bool(self.running)


@pytest.fixture
def fake_vllm(monkeypatch):
    calls = {"engine": FakeLLMEngine()}

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class Tokenizer:
        def apply_chat_template(self, conversation, add_generation_prompt, tokenize):
            assert add_generation_prompt and tokenize
            return [len(message["content"]) for message in conversation]

    class LLM:
        def __init__(self, **kwargs):
            calls["init"] = kwargs
            self.llm_engine = calls["engine"]

        def get_tokenizer(self):
            return Tokenizer()

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    return calls


def test_vllm_backend_maps_config_and_params(fake_vllm):
    config = LLMConfig(backend="vllm", vllm=VLLMConfig(model="/w/llama", tensor_parallel_size=4,
                                                       quantization="gptq", dtype="float16"))
    llm = create_llm(config)
    assert fake_vllm["init"]["tensor_parallel_size"] == 4 and fake_vllm["init"]["quantization"] == "gptq"
    conversations = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "hello"}]]
    out = llm.generate(conversations, GenParams(max_tokens=2, temperature=0.7, n=3, stop=["X"], seed=5))
    assert out == [["out out"] * 3] * 2 and cut_short(out[0][0]) == LENGTH  # vLLM's finish_reason is kept
    engine = fake_vllm["engine"]
    assert [prompt for _, prompt, _ in engine.added] == [{"prompt_token_ids": [2]}, {"prompt_token_ids": [5]}]
    assert engine.added[0][2] == {"n": 3, "temperature": 0.7, "max_tokens": 2, "stop": ["X"], "seed": 5,
                                  "logprobs": None}
    assert len({request_id for request_id, _, _ in engine.added}) == 2 and out[0][0].top_logprobs == ()
    scored = llm.generate(conversations, GenParams(max_tokens=1, top_logprobs=2))
    assert engine.added[-1][2]["logprobs"] == 2 and scored[0][0].top_logprobs == ({" out": -0.1, " in": -2.5},)
    assert llm.generate(conversations, GenParams(deadline=Deadline(0))) == [[], []]
    assert len({request_id for request_id, _, _ in engine.added}) == 4  # ids are never reused


def test_vllm_a_slow_batch_returns_what_finished_at_the_deadline(fake_vllm, caplog_loguru):
    """Two requests of 3 words finish; one of 30 words is aborted at the deadline and keeps its text, cut short."""
    llm = create_llm(LLMConfig(backend="vllm", vllm=VLLMConfig(model="/w/llama")))
    engine = fake_vllm["engine"]
    engine.step_s = 0.1
    long = GenParams(max_tokens=30, deadline=Deadline(1.0))
    started = time.monotonic()
    engine.words = 30
    out = llm.generate([[{"role": "user", "content": "a"}]], long)
    took = time.monotonic() - started
    assert took < 1.0 + 0.5 and engine.aborted == [engine.added[-1][0]]  # a contract with a margin
    (sample,) = out[0]
    assert 5 <= len(sample.split()) < 30 and cut_short(sample) == DEADLINE
    assert "1 of 1 requests aborted" in caplog_loguru.text
    engine.words, engine.aborted = 3, []
    done = llm.generate([[{"role": "user", "content": "b"}]] * 2, GenParams(max_tokens=30, deadline=Deadline(5.0)))
    assert done == [["out out out"]] * 2 and cut_short(done[0][0]) is None and engine.aborted == []


def test_vllm_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(BackendUnavailable, match="vllm is not installed"):
        create_llm(LLMConfig(backend="vllm", vllm=VLLMConfig(model="x")))


class ChatServer:
    """A loopback OpenAI-style server: fails the first `failures` requests with `status`, then answers
    `answer_with(request body)`, or by default echoes the last message and " STOP tail"; the answer is cut to
    max_tokens words with finish_reason "length", as servers report a cut."""

    def __init__(self, failures: int = 0, status: int = 503, answer_with=None, logprobs_with=None,
                 refuse_logprobs: bool = False, raw_body=None, trickle_s=0.0) -> None:
        """Log-probabilities as the servers give them: with `logprobs_with(word, body)` (the top alternatives of
        one answer word, [(token, logprob)], most likely first), a request with logprobs and top_logprobs gets choice.logprobs.content
        (vLLM, OpenAI); without it they are ignored (transformers serve); with `refuse_logprobs`, such a request
        gets HTTP 400 naming the field (as APIs that do not offer them). Faults: `raw_body(request body)` is sent
        as the reply's bytes instead (garbage, a huge reply; None: the normal reply); `trickle_s` (seconds, or a
        function of the request body) sends the reply 16 bytes at a time, one piece every trickle_s seconds,
        each read well inside any read timeout."""
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                if len(server.requests) <= failures:
                    code, reply = status, {"error": {"message": "try later"}}
                elif refuse_logprobs and body.get("logprobs"):
                    code, reply = 400, {"error": {"message": "logprobs is not supported by this model",
                                                 "param": "logprobs"}}
                else:
                    words = (answer_with(body) if answer_with else body["messages"][-1]["content"] + " STOP tail"
                             ).split()
                    limit = body.get("max_tokens") or len(words)  # a word per token; cut at max_tokens, as servers do
                    text, finish = " ".join(words[:limit]), "length" if len(words) > limit else "stop"
                    code, reply = 200, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                        "choices": [{"index": i, "finish_reason": finish,
                                                     "message": {"role": "assistant", "content": text},
                                                     "logprobs": logprobs(words[:limit], body)}
                                                    for i in range(body.get("n") or 1)]}
                data = (raw_body(body) if raw_body else None) or json.dumps(reply).encode()
                pause = trickle_s(body) if callable(trickle_s) else trickle_s
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    if not pause:
                        self.wfile.write(data)
                    for start in range(0, len(data), 16) if pause else ():
                        self.wfile.write(data[start:start + 16])
                        self.wfile.flush()
                        time.sleep(pause)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up on the reply
                    pass

        def logprobs(words: list[str], body: dict) -> dict | None:
            if logprobs_with is None or not body.get("logprobs"):
                return None
            steps = [logprobs_with(word, body)[:body.get("top_logprobs") or 0] for word in words]
            return {"content": [{"token": word, "logprob": top[0][1] if top else 0.0, "bytes": None,
                                 "top_logprobs": [{"token": t, "logprob": lp, "bytes": None} for t, lp in top]}
                                for word, top in zip(words, steps)]}

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server(request):
    server = ChatServer(*getattr(request, "param", ()))
    yield server
    server.close()


def _backend(url: str, **overrides) -> OpenAIBackend:
    return OpenAIBackend(OpenAIConfig(base_url=url, model="m", backoff_s=0.01, **overrides))


def test_openai_sends_prompts_cuts_stop_and_uses_env_key(chat_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    out = _backend(chat_server.url).generate([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
                                             GenParams(max_tokens=5, stop=["STOP"]))
    assert out == [["a"], ["b"]]
    assert {r["auth"] for r in chat_server.requests} == {"Bearer sk-test"}
    assert chat_server.requests[0]["body"]["max_tokens"] == 5 and chat_server.requests[0]["body"]["stop"] == ["STOP"]


def test_openai_reports_a_generation_cut_at_max_tokens(chat_server):
    conversation = [[{"role": "user", "content": "one two three"}]]
    ((cut,),) = _backend(chat_server.url).generate(conversation, GenParams(max_tokens=2))
    ((whole,),) = _backend(chat_server.url).generate(conversation, GenParams(max_tokens=50))
    assert (cut, cut_short(cut)) == ("one two", LENGTH) and cut_short(whole) is None


def test_openai_n_as_separate_requests_or_native(chat_server):
    conversation = [[{"role": "user", "content": "a"}]]
    assert _backend(chat_server.url).generate(conversation, GenParams(n=3)) == [["a STOP tail"] * 3]
    assert len(chat_server.requests) == 3
    assert _backend(chat_server.url, native_n=True).generate(conversation, GenParams(n=3)) == [["a STOP tail"] * 3]
    assert len(chat_server.requests) == 4 and chat_server.requests[-1]["body"]["n"] == 3


@pytest.mark.parametrize("chat_server", [(2, 503)], indirect=True)
def test_openai_retries_transient_errors(chat_server):
    out = _backend(chat_server.url, max_retries=3).generate([[{"role": "user", "content": "a"}]], GenParams())
    assert out == [["a STOP tail"]] and len(chat_server.requests) == 3


@pytest.mark.parametrize("chat_server", [(5, 503)], indirect=True)
def test_openai_gives_up_after_bounded_retries(chat_server):
    out = _backend(chat_server.url, max_retries=2).generate([[{"role": "user", "content": "a"}]], GenParams())
    assert out == [[]] and len(chat_server.requests) == 3


@pytest.mark.parametrize("chat_server", [(5, 400)], indirect=True)
def test_openai_does_not_retry_a_bad_request(chat_server):
    out = _backend(chat_server.url, max_retries=3).generate([[{"role": "user", "content": "a"}]], GenParams())
    assert out == [[]] and len(chat_server.requests) == 1


def test_openai_unreachable_server_and_expired_deadline_return_empty():
    backend = _backend("http://127.0.0.1:9/v1", max_retries=1)
    assert backend.generate([[{"role": "user", "content": "a"}]], GenParams()) == [[]]
    assert backend.generate([[{"role": "user", "content": "a"}]], GenParams(deadline=Deadline(0))) == [[]]


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
    assert sample == "Correct. same person" and len(sample.top_logprobs) == 3
    assert sample.top_logprobs[0] == pytest.approx({"Correct.": math.log(0.9), " Incorrect": math.log(0.08)})
    assert server.requests[0]["body"]["top_logprobs"] == 2 and "logprobs" not in server.requests[1]["body"]
    assert plain.top_logprobs == ()


def test_openai_without_log_probabilities_answers_from_the_text(caplog_loguru):
    ignoring = ChatServer(answer_with=lambda body: "Correct.")  # transformers serve: the fields are ignored
    refusing = ChatServer(answer_with=lambda body: "Correct.", refuse_logprobs=True)
    try:
        ignored = _backend(ignoring.url).generate([[{"role": "user", "content": "q"}]], GenParams(top_logprobs=5))
        backend = _backend(refusing.url)
        first = backend.generate([[{"role": "user", "content": "q"}]], GenParams(top_logprobs=5))
        second = backend.generate([[{"role": "user", "content": "q"}]], GenParams(top_logprobs=5))
    finally:
        ignoring.close()
        refusing.close()
    assert ignored == first == second == [["Correct."]] and ignored[0][0].top_logprobs == ()
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
    assert out == [[]] and expected_log in caplog_loguru.text


def test_openai_a_reply_without_choices_or_message_is_no_sample():
    empty = ChatServer(raw_body=lambda body: b'{"id": "x", "object": "chat.completion", "choices": []}')
    odd = ChatServer(raw_body=lambda body: b'{"choices": [{"index": 0, "finish_reason": "stop"}]}')
    try:
        assert _backend(empty.url).generate([[{"role": "user", "content": "a"}]], GenParams()) == [[]]
        assert _backend(odd.url).generate([[{"role": "user", "content": "a"}]], GenParams()) == [[""]]
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
    assert out == [[]] * 4 and len(server.requests) == 8  # each request tried twice
    errors = [line for line in caplog_loguru.text.splitlines() if "| ERROR" in line]
    assert len(errors) == 1 and "4 of 4 requests got no reply: InternalServerError" in errors[0]
    assert "after 2 attempts (x4)" in errors[0]


def _hang(body):
    time.sleep(2.5)  # well past the deadline (1 s), and each retry would wait as long
    return "too late"


@pytest.mark.parametrize("fault, retries, logged", [
    # 16 bytes every 0.2 s: each read is quick, the whole reply would take about 4 s
    ({"raw_body": lambda body: _completion("y" * 200), "trickle_s": 0.2}, 0, "still arriving after 1.0 s"),
    ({"answer_with": _hang}, 2, "no reply"),  # nothing at all until after the deadline
], ids=["trickle", "hang"])
def test_openai_a_slow_server_is_left_at_the_deadline(fault, retries, logged, caplog_loguru):
    server = ChatServer(**fault)
    try:
        started = time.monotonic()
        out = _backend(server.url, max_retries=retries, request_timeout_s=30).generate(
            [[{"role": "user", "content": "a"}]], GenParams(deadline=Deadline(1.0)))
        took = time.monotonic() - started
    finally:
        server.close()
    assert out == [[]] and logged in caplog_loguru.text
    assert took < 1.0 + 1.5  # a contract with a margin, not a speed figure: unbounded, each takes 2.5-4 s
