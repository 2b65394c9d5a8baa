"""Backend logic without real models: the registry, vLLM's parameter mapping, OpenAI retries and n."""

import json
import math
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from utils.deadline import Deadline
from models.config import LLMConfig, OpenAIConfig, VLLMConfig
from models.llm.base import LENGTH, BackendUnavailable, GenParams, create_llm, cut_at_stop, cut_short
from models.llm.openai import OpenAIBackend
from models.llm.vllm import load_input_embeddings


def test_cut_at_stop():
    assert cut_at_stop("a. b ===END=== c", ["===END===", "."]) == "a"
    assert cut_at_stop("abc", []) == "abc"


class FakeTokenizer:
    """A word-level stand-in for the tokenizer `LLM.get_tokenizer()` returns (vLLM's TokenizerLike: encode and
    apply_chat_template take the release's parameters, checked in test_vllm_engine_api.py). The chat template is
    "<s> role: content ... assistant:"; tokenizing it encodes its text without adding special tokens, as
    transformers' apply_chat_template does. Ids grow with new words (1 is <s>)."""

    def __init__(self) -> None:
        self.vocab = {"<s>": 1}

    def encode(self, text, truncation=None, max_length=None, add_special_tokens=True):
        ids = [self.vocab.setdefault(word, len(self.vocab) + 1) for word in text.split()]
        return ([1] if add_special_tokens else []) + ids

    def apply_chat_template(self, messages, tools=None, **kwargs):
        text = "<s> " + " ".join(f"{m['role']}: {m['content']}" for m in messages)
        text += " assistant:" if kwargs.get("add_generation_prompt") else ""
        return self.encode(text, add_special_tokens=False) if kwargs.get("tokenize", True) else text


class FakeLLMEngine:
    """vLLM's V1 LLMEngine as `LLM.llm_engine` for the step-by-step driver. Its methods' parameters are those of
    the pinned release (tests/unit/test_vllm_engine_api.py checks them against data/vllm/engine_api-*.json). Each
    step gives every unfinished request one more word ("out"), as a cumulative RequestOutput; a request finishes
    after `words` words ("stop") or at max_tokens ("length"). `step_s` makes each step that slow.

    add_request checks a prompt as the release does (vllm/inputs/preprocess.py _process_embeds,
    vllm/v1/engine/input_processor.py _validate_model_input): a TokensPrompt or an EmbedsPrompt (their keys are
    the release's TypedDict fields, checked against the extract), prompt_embeds only with enable_prompt_embeds,
    a (seq_len, hidden_size) tensor ((1, seq_len, hidden) squeezed), and a prompt shorter than max_model_len.
    Where the release would crash the engine (embeddings of the wrong hidden size), this one raises."""

    TOKENS_PROMPT = {"prompt_token_ids", "prompt", "token_type_ids", "multi_modal_data", "mm_processor_kwargs",
                     "multi_modal_uuids", "cache_salt"}
    EMBEDS_PROMPT = {"prompt_embeds", "cache_salt"}

    def __init__(self, words: int = 3, step_s: float = 0.0) -> None:
        self.words, self.step_s = words, step_s
        self.engine_args: dict = {}  # what vllm.LLM(...) was given (the fake LLM sets it)
        self.running: dict[str, list] = {}  # request id -> [sampling params, words so far]
        self.added: list[tuple] = []
        self.aborted: list[str] = []

    def _hidden_size(self) -> int | None:
        config = Path(self.engine_args.get("model", "")) / "config.json"
        return json.loads(config.read_text())["hidden_size"] if config.is_file() else None

    def _prompt_length(self, prompt) -> int:
        if "prompt_embeds" in prompt and "prompt_token_ids" not in prompt:
            unknown = set(prompt) - self.EMBEDS_PROMPT
            if unknown:
                raise ValueError(f"EmbedsPrompt takes no {sorted(unknown)}")
            if not self.engine_args.get("enable_prompt_embeds", False):
                raise ValueError("You must set `--enable-prompt-embeds` to input `prompt_embeds`.")
            embeds = prompt["prompt_embeds"]
            embeds = embeds.squeeze(dim=0) if embeds.ndim == 3 else embeds
            if embeds.ndim != 2:
                raise ValueError("prompt_embeds must be of shape (seq_len, hidden_size).")
            hidden = self._hidden_size()
            if hidden is not None and embeds.shape[1] != hidden:
                raise RuntimeError(f"prompt_embeds of width {embeds.shape[1]} crash a model of hidden size {hidden}")
            return embeds.shape[0]
        unknown = set(prompt) - self.TOKENS_PROMPT
        if "prompt_token_ids" not in prompt or unknown:
            raise ValueError(f"not a TokensPrompt: keys {sorted(prompt)}")
        if not prompt["prompt_token_ids"]:
            raise ValueError("The decoder prompt cannot be empty")
        return len(prompt["prompt_token_ids"])

    def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None, tokenization_kwargs=None,
                    trace_headers=None, priority=0, prompt_text=None):
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id)}")
        length, limit = self._prompt_length(prompt), self.engine_args.get("max_model_len", 4096)
        if length >= limit:
            raise ValueError(f"The decoder prompt (length {length}) is longer than the maximum model length of "
                             f"{limit}. Make sure that `max_model_len` is no smaller than the number of text tokens.")
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
    calls = {"engine": FakeLLMEngine(), "tokenizer": FakeTokenizer()}

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs):
            calls["init"] = kwargs
            self.llm_engine = calls["engine"]
            self.llm_engine.engine_args = kwargs

        def get_tokenizer(self):
            return calls["tokenizer"]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    return calls


def model_folder(path: Path, hidden: int = 8, vocab: int = 64, shards: int = 1) -> Path:
    """A Llama-like folder: config.json and safetensors with the input embeddings (bfloat16, as Llama-3.1 ships)
    and a norm; with shards > 1, the embeddings in the last shard, named by model.safetensors.index.json."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
                                                  "vocab_size": vocab, "torch_dtype": "bfloat16"}))
    table = torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    tensors = {"model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16), "model.embed_tokens.weight": table}
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"))
        return path
    names = [f"model-0000{i}-of-0000{shards}.safetensors" for i in range(1, shards + 1)]
    save_file({"model.norm.weight": tensors["model.norm.weight"]}, str(path / names[0]))
    save_file({"model.embed_tokens.weight": table}, str(path / names[-1]))
    weight_map = {"model.norm.weight": names[0], "model.embed_tokens.weight": names[-1]}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def test_vllm_backend_maps_config_and_params(fake_vllm):
    config = LLMConfig(backend="vllm", vllm=VLLMConfig(model="/w/llama", tensor_parallel_size=4,
                                                       quantization="gptq", dtype="float16"))
    llm = create_llm(config)
    assert fake_vllm["init"]["tensor_parallel_size"] == 4 and fake_vllm["init"]["quantization"] == "gptq"
    assert fake_vllm["init"]["enable_prompt_embeds"] is False
    conversations = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "hello"}]]
    out = llm.generate(conversations, GenParams(max_tokens=2, temperature=0.7, n=3, stop=["X"], seed=5))
    assert out == [["out out"] * 3] * 2 and cut_short(out[0][0]) == LENGTH  # vLLM's finish_reason is kept
    engine, tokenizer = fake_vllm["engine"], fake_vllm["tokenizer"]
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in ("<s> user: hi assistant:",
                                                                        "<s> user: hello assistant:")]
    assert [prompt for _, prompt, _ in engine.added] == [{"prompt_token_ids": ids[0]}, {"prompt_token_ids": ids[1]}]
    assert ids[0][0] == 1 and ids[0].count(1) == 1  # one BOS: the template's, none added
    assert engine.added[0][2] == {"n": 3, "temperature": 0.7, "max_tokens": 2, "stop": ["X"], "seed": 5,
                                  "logprobs": None}
    assert len({request_id for request_id, _, _ in engine.added}) == 2 and out[0][0].top_logprobs == ()
    scored = llm.generate(conversations, GenParams(max_tokens=1, top_logprobs=2))
    assert engine.added[-1][2]["logprobs"] == 2 and scored[0][0].top_logprobs == ({" out": -0.1, " in": -2.5},)
    assert llm.generate(conversations, GenParams(deadline=Deadline(0))) == [[], []]
    assert len({request_id for request_id, _, _ in engine.added}) == 4  # ids are never reused
    assert not hasattr(llm, "generate_with_embeddings")  # R2AG prompt mode falls back (models/system.py)


def test_vllm_a_prompt_the_engine_refuses_costs_its_conversation_only(fake_vllm, caplog_loguru):
    llm = create_llm(LLMConfig(backend="vllm", vllm=VLLMConfig(model="/w/llama", max_model_len=8)))
    long = [{"role": "user", "content": " ".join(["word"] * 20)}]
    out = llm.generate([[{"role": "user", "content": "hi"}], long], GenParams(max_tokens=3))
    assert out == [["out out out"], []] and len(fake_vllm["engine"].added) == 1
    assert "vllm refused prompt crag-1: The decoder prompt (length 23) is longer" in caplog_loguru.text


def test_vllm_r2ag_sends_whole_prompts_as_input_embeddings(fake_vllm, tmp_path):
    """Placeholders are cut out of the template's text, the pieces tokenized and looked up in the folder's input
    embeddings, and each placeholder's position takes its retrieval vector; no placeholder: token ids."""
    folder = model_folder(tmp_path / "llama")
    llm = create_llm(LLMConfig(backend="vllm", vllm=VLLMConfig(model=str(folder), enable_prompt_embeds=True)))
    assert fake_vllm["init"]["enable_prompt_embeds"] is True and llm.hidden_size == 8
    mark = llm.retrieval_placeholder()
    vectors = np.arange(16, dtype=np.float32).reshape(2, 8) / 8
    conversations = [[{"role": "system", "content": "answer"}, {"role": "user", "content": f"a {mark}b c {mark}"}],
                     [{"role": "user", "content": "no references"}]]
    out = llm.generate_with_embeddings(conversations, [vectors, np.zeros((0, 8))], GenParams(max_tokens=3))
    assert out == [["out out out"]] * 2
    (_, first, _), (_, second, _) = fake_vllm["engine"].added
    tokenizer = fake_vllm["tokenizer"]
    assert second == {"prompt_token_ids": tokenizer.apply_chat_template(conversations[1], add_generation_prompt=True,
                                                                        tokenize=True)}
    assert set(first) == {"prompt_embeds"}
    embeds = first["prompt_embeds"]
    pieces = ["<s> system: answer user: a", "b c", "assistant:"]
    ids = [tokenizer.encode(piece, add_special_tokens=False) for piece in pieces]
    table = load_input_embeddings(folder)
    assert embeds.dtype == torch.bfloat16 and embeds.shape == (len(ids[0]) + 1 + len(ids[1]) + 1 + len(ids[2]), 8)
    slots = [len(ids[0]), len(ids[0]) + 1 + len(ids[1])]
    assert torch.equal(embeds[slots], torch.from_numpy(vectors).to(torch.bfloat16))
    kept = [i for i in range(len(embeds)) if i not in slots]
    assert torch.equal(embeds[kept], table[[t for piece in ids for t in piece]])


def test_vllm_r2ag_checks_counts_widths_and_the_folder(fake_vllm, tmp_path):
    folder = model_folder(tmp_path / "sharded", hidden=6, shards=2)
    llm = create_llm(LLMConfig(backend="vllm", vllm=VLLMConfig(model=str(folder), enable_prompt_embeds=True,
                                                               dtype="float16")))
    assert llm.hidden_size == 6  # found through the index, in the second shard
    conversation = [[{"role": "user", "content": f"x {llm.retrieval_placeholder()}"}]]
    with pytest.raises(ValueError, match="1 retrieval placeholders in the prompt, 2 embeddings"):
        llm.generate_with_embeddings(conversation, [np.ones((2, 6))], GenParams())
    with pytest.raises(ValueError, match=r"shape \(1, 4\), the model's hidden size is 6"):
        llm.generate_with_embeddings(conversation, [np.ones((1, 4))], GenParams())
    with pytest.raises(ValueError, match="1 retrieval placeholders in the prompt, 0 embeddings"):
        llm.generate_with_embeddings(conversation, [np.zeros((0, 6))], GenParams())
    llm.generate_with_embeddings(conversation, [np.ones((1, 6))], GenParams(max_tokens=1))
    assert fake_vllm["engine"].added[-1][1]["prompt_embeds"].dtype == torch.float16  # the configured dtype
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    fake_vllm.pop("init")
    with pytest.raises(BackendUnavailable, match="no model.embed_tokens.weight in its safetensors"):
        create_llm(LLMConfig(backend="vllm", vllm=VLLMConfig(model=str(bare), enable_prompt_embeds=True)))
    assert "init" not in fake_vllm  # refused before the engine starts


def test_the_fake_engine_refuses_embeddings_unless_enabled(fake_vllm, tmp_path):
    """The release's check, so that a backend that forgot to pass enable_prompt_embeds fails here."""
    engine = FakeLLMEngine()
    engine.engine_args = {"model": str(model_folder(tmp_path / "m"))}
    params = types.SimpleNamespace(kwargs={"max_tokens": 1, "n": 1, "logprobs": None})
    with pytest.raises(ValueError, match="You must set `--enable-prompt-embeds`"):
        engine.add_request("r", {"prompt_embeds": torch.zeros(3, 8)}, params)
    engine.engine_args["enable_prompt_embeds"] = True
    with pytest.raises(RuntimeError, match="hidden size 8"):
        engine.add_request("r", {"prompt_embeds": torch.zeros(3, 5)}, params)
    engine.add_request("r", {"prompt_embeds": torch.zeros(1, 3, 8)}, params)
    assert engine.has_unfinished_requests()


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
