"""A stand-in for the `vllm` package that VLLMBackend drives, following the pinned release's source.

What it follows, file by file (vLLM's V1 engine; the parameters are checked against data/vllm/engine_api-*.json in
tests/unit/test_vllm_engine_api.py):
- `vllm/sampling_params.py` `SamplingParams.__post_init__` / `_verify_args` / `_verify_greedy_sampling`: the
  checks that raise at construction (n >= 1, greedy sampling with n > 1, max_tokens >= 1, logprobs >= 0,
  temperature in [0, 2]), and `RequestOutputKind` (CUMULATIVE, the default; DELTA; FINAL_ONLY).
- `vllm/v1/engine/llm_engine.py` `LLMEngine.add_request`: a request with n > 1 becomes n child requests named
  `{index}_{request_id}` (`vllm/v1/engine/parallel_sampling.py` `ParentRequest.get_child_info`), each with n = 1
  and, when the parent has a seed, seed + index.
- `vllm/v1/engine/output_processor.py` `RequestState.make_request_output` and `ParentRequest.get_outputs`: each
  `RequestOutput` of a parent carries one child's `CompletionOutput` (with its `index`) in CUMULATIVE and DELTA;
  a finished child is not sent again; the parent is `finished` only when every child is; FINAL_ONLY emits
  nothing until the last child finishes and then all n completions at once. DELTA carries only the new
  tokens' text, ids and log-probabilities.
- `OutputProcessor.abort_requests`: aborting a parent id aborts its unfinished children; nothing is emitted for
  an aborted request (LLMEngine has no output queue).
- `vllm/v1/engine/detokenizer.py` `check_stop_strings`, called from `OutputProcessor.process_outputs`: a stop
  string found in the new text finishes the request ("stop", `stop_reason` the string) with the text cut before
  it.
- `vllm/v1/engine/core_client.py` `SyncMPClient.shutdown` (as `llm_engine.engine_core`): stops the engine core;
  a second call does nothing.
- `vllm/transformers_utils/config.py` `get_config` and `patch_rope_parameters` under transformers 4.57 (the
  release's pin): the folder's config.json read with 4.57's RoPE keys (`rope_theta`, else the class default;
  `rope_scaling`), then rope_parameters = rope_scaling, else the json's own rope_parameters, else the default
  type, with `rope_theta` written into it; a nested rope_parameters that gains `rope_theta` is refused as vLLM's
  `patch_rope_parameters_dict` refuses it.
- `vllm/v1/engine/logprobs.py`: with `logprobs=k`, each generated token's entry maps token ids to
  `Logprob(logprob, rank, decoded_token)`: the k most likely tokens and the sampled one (k + 1 entries when the
  sampled token is not among the k).

The model is scripted: child `index` repeats one word (`WORDS[index]`, token id 100 + index) and finishes after
`words + index` words ("stop") unless max_tokens comes first ("length"); its sampled token has log-probability
-0.1 x (index + 1), rank 1 for child 0 and rank 2 for the others (TOP, LAST). `on_step` is called at every step
(a test's clock advances there), so deadlines are tested without real time.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

WORDS = ("out", "red", "sun", "ice", "owl", "fig", "oak", "elm")
# The tokens ranked around a sampled one: child 0 samples the most likely token (greedy's choice), the other
# children the second most likely, so the sampled token need not be among the top k.
TOP = (8, " at", -0.05)
LAST = (9, " in", -2.5)


class RequestOutputKind(enum.Enum):
    """vllm/sampling_params.py RequestOutputKind."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclasses.dataclass(frozen=True)
class LoRARequest:
    """vllm/lora/request.py LoRARequest: a name, an id above 0 and a path that is not empty (its __post_init__)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        assert self.lora_path, "lora_path cannot be empty"


class SamplingParams:
    """The keyword-only construction of vllm/sampling_params.py SamplingParams, with the checks its
    __post_init__ makes; `kwargs` keeps what the caller passed."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.n = kwargs.get("n", 1)
        self.temperature = kwargs.get("temperature", 1.0)
        self.max_tokens = kwargs.get("max_tokens", 16)
        self.seed = kwargs.get("seed")
        self.logprobs = kwargs.get("logprobs")
        stop = kwargs.get("stop")
        self.stop = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        self.output_kind = kwargs.get("output_kind", RequestOutputKind.CUMULATIVE)
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.logprobs is not None and self.logprobs != -1 and self.logprobs < 0:
            raise ValueError(f"logprobs must be non-negative or -1, got {self.logprobs}.")
        if self.temperature < 1e-5 and self.n > 1:
            raise ValueError("n must be 1 when using greedy sampling")

    def child(self, index: int) -> SamplingParams:
        """ParentRequest._get_child_sampling_params: n = 1, and seed + index when seeded."""
        seed = None if self.seed is None else self.seed + index
        return SamplingParams(**{**self.kwargs, "n": 1, "seed": seed})


@dataclass
class Logprob:
    """vllm/logprobs.py Logprob."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """vllm/outputs.py CompletionOutput."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """vllm/outputs.py RequestOutput (the fields the backend reads)."""

    request_id: str
    outputs: list[CompletionOutput]
    finished: bool
    prompt_token_ids: list[int] | None = None


@dataclass
class _Child:
    request_id: str
    index: int
    params: SamplingParams
    parent: _Parent | None
    words: int  # words this child says before it stops
    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    sent: int = 0  # tokens already sent (DELTA)
    text: str = ""  # the whole text so far, cut at a stop string
    text_sent: int = 0  # characters already sent (DELTA)


@dataclass
class _Parent:
    """parallel_sampling.py ParentRequest: the children still running and, for FINAL_ONLY, the aggregator."""

    request_id: str
    params: SamplingParams
    child_requests: set[str] = field(default_factory=set)
    aggregator: list[CompletionOutput | None] = field(default_factory=list)

    def get_outputs(self, child_id: str, output: CompletionOutput) -> tuple[list[CompletionOutput], bool]:
        already_returned = False
        if output.finished():
            if child_id in self.child_requests:
                self.child_requests.remove(child_id)
            else:
                already_returned = True
        if self.params.output_kind != RequestOutputKind.FINAL_ONLY:
            outputs = [] if already_returned else [output]
        else:
            self.aggregator[output.index] = output
            outputs = [] if self.child_requests else list(self.aggregator)
        return outputs, not self.child_requests


class FakeEngineCore:
    """core_client.py SyncMPClient, as far as shutdown goes: its finalizer runs once."""

    def __init__(self) -> None:
        self.shutdowns = 0  # calls that stopped the core (a second call does not)

    def shutdown(self) -> None:
        self.shutdowns = 1


class FakeLLMEngine:
    """vLLM's V1 LLMEngine as `LLM.llm_engine`, driven step by step (see the module docstring for the files it
    follows). add_request checks a prompt as the release does (vllm/inputs/preprocess.py _process_embeds,
    vllm/v1/engine/input_processor.py _validate_model_input): a TokensPrompt or an EmbedsPrompt (their keys are the
    release's TypedDict fields), prompt_embeds only with enable_prompt_embeds, a (seq_len, hidden_size) tensor
    ((1, seq_len, hidden) squeezed), a non-empty prompt shorter than max_model_len (one of that length leaves no
    room for the token every request generates: refused with its own message). Where the release would crash the
    engine (embeddings of the wrong hidden size), this one raises."""

    TOKENS_PROMPT = {"prompt_token_ids", "prompt", "token_type_ids", "multi_modal_data", "mm_processor_kwargs",
                     "multi_modal_uuids", "cache_salt"}
    EMBEDS_PROMPT = {"prompt_embeds", "cache_salt"}

    def __init__(self, words: int = 3, on_step: Callable[[], None] = lambda: None) -> None:
        self.words, self.on_step = words, on_step
        self.engine_args: dict = {}  # what vllm.LLM(...) was given (FakeLLM sets it)
        self.added: list[tuple] = []  # (request_id, prompt, params.kwargs) per add_request
        self.loras: list = []  # the lora_request of each add_request
        self.aborted: list[str] = []  # the ids abort_request was given
        self.steps = 0
        self.engine_core = FakeEngineCore()
        self._running: dict[str, _Child] = {}  # child (or n = 1 request) id -> state
        self._parents: dict[str, _Parent] = {}

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
        if length > limit:
            raise ValueError(f"The decoder prompt (length {length}) is longer than the maximum model length of "
                             f"{limit}. Make sure that `max_model_len` is no smaller than the number of text tokens.")
        if length == limit:  # no room for the one token every request generates
            raise ValueError(f"The decoder prompt (length {length}) plus the number of requested output tokens (at "
                             f"least 1) is longer than the maximum model length of {limit}. Make sure that "
                             "`max_model_len` is no smaller than the number of text tokens (prompt + requested output "
                             "tokens).")
        if lora_request is not None and not self.engine_args.get("enable_lora"):  # input_processor.py _validate_lora
            raise ValueError(f"Got lora_request {lora_request} but LoRA is not enabled!")
        if request_id in self._running or request_id in self._parents:
            raise ValueError(f"Request id {request_id} already running.")
        self.added.append((request_id, prompt, params.kwargs))
        self.loras.append(lora_request)
        if params.n == 1:
            self._running[request_id] = _Child(request_id, 0, params, None, self.words)
            return
        parent = _Parent(request_id, params)
        if params.output_kind == RequestOutputKind.FINAL_ONLY:
            parent.aggregator = [None] * params.n
        self._parents[request_id] = parent
        for index in range(params.n):
            child_id = f"{index}_{request_id}"
            parent.child_requests.add(child_id)
            self._running[child_id] = _Child(child_id, index, params.child(index), parent, self.words + index)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        self.on_step()
        outputs = []
        for child in list(self._running.values()):
            output = self._advance(child)
            if output is not None:
                outputs.append(output)
        return outputs

    def _advance(self, child: _Child) -> RequestOutput | None:
        """One generated token for `child`, and what make_request_output emits for it (None: nothing)."""
        kind = (child.parent.params if child.parent else child.params).output_kind
        token = 100 + child.index
        child.tokens.append(token)
        if child.params.logprobs is not None:
            child.logprobs.append(_logprobs(child, token))
        limit = child.params.max_tokens
        reason = "length" if len(child.tokens) >= limit else "stop" if len(child.tokens) >= child.words else None
        new_text = " " + WORDS[child.index % len(WORDS)]
        child.text += new_text
        stop_reason = None
        for stop in child.params.stop:  # check_stop_strings, include_stop_str_in_output false
            at = child.text.find(stop, max(0, len(child.text) + 1 - len(new_text) - len(stop)))
            if at != -1:
                child.text, reason, stop_reason = child.text[:at], "stop", stop
                break
        if reason is not None:
            del self._running[child.request_id]
        if reason is None and kind == RequestOutputKind.FINAL_ONLY:
            return None
        start = child.sent if kind == RequestOutputKind.DELTA else 0
        text_start = child.text_sent if kind == RequestOutputKind.DELTA else 0
        child.sent, child.text_sent = len(child.tokens), len(child.text)
        completion = CompletionOutput(
            index=child.index, text=child.text[text_start:], token_ids=child.tokens[start:],
            cumulative_logprob=sum(step[t].logprob for step, t in zip(child.logprobs, child.tokens))
            if child.params.logprobs is not None else None,
            logprobs=child.logprobs[start:] if child.params.logprobs is not None else None,
            finish_reason=reason, stop_reason=stop_reason)
        if child.parent is None:
            return RequestOutput(child.request_id, [completion], completion.finished())
        outputs, finished = child.parent.get_outputs(child.request_id, completion)
        if finished:
            self._parents.pop(child.parent.request_id, None)
        return RequestOutput(child.parent.request_id, outputs, finished) if outputs else None

    def abort_request(self, request_ids, internal=False):
        self.aborted.extend(request_ids)
        for request_id in request_ids:
            if self._running.pop(request_id, None) is None and (parent := self._parents.pop(request_id, None)):
                for child_id in parent.child_requests:
                    self._running.pop(child_id, None)

    def has_unfinished_requests(self):
        return bool(self._running)


def _logprobs(child: _Child, token: int) -> dict[int, Logprob]:
    """One step's entry as vllm/v1/engine/logprobs.py builds it: the top k with their ranks, plus the sampled
    token with its own rank where it is not among them."""
    sampled = (token, " " + WORDS[child.index % len(WORDS)], -0.1 * (child.index + 1))
    ranked = [sampled, LAST] if child.index == 0 else [TOP, sampled, LAST]
    entry = {tid: Logprob(lp, rank, text) for rank, (tid, text, lp) in enumerate(ranked, 1)
             if rank <= child.params.logprobs}
    rank = ranked.index(sampled) + 1
    entry.setdefault(token, Logprob(sampled[2], rank, sampled[1]))
    return entry


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


def model_folder(path: Path, hidden: int = 8, vocab: int = 64, shards: int = 1) -> Path:
    """A Llama-like folder: config.json and safetensors with the input embeddings (bfloat16, as Llama-3.1 ships)
    and a norm; with shards > 1, the embeddings in the last shard, named by model.safetensors.index.json."""
    import torch
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


# transformers 4.57's rope_theta defaults: Gemma 3's global layers 1e6, every other family of the project 1e4.
ROPE_THETA_DEFAULTS = {"gemma3": 1000000.0, "gemma3_text": 1000000.0}


class EngineHFConfig:
    """What `get_config` returns, as far as VLLMBackend reads it: `to_dict()`."""

    def __init__(self, data: dict) -> None:
        self._data = data

    def to_dict(self) -> dict:
        return json.loads(json.dumps(self._data))


def get_config(model: str, trust_remote_code: bool = False, **_: object) -> EngineHFConfig:
    with open(f"{model}/config.json", encoding="utf-8") as handle:
        data = json.load(handle)
    text = data.get("text_config", data)
    theta = text.get("rope_theta", ROPE_THETA_DEFAULTS.get(text.get("model_type", data.get("model_type")), 10000.0))
    params = text.get("rope_scaling") or dict(text.get("rope_parameters") or {}) or {"rope_type": "default"}
    params = {**params, "rope_theta": theta}
    if "rope_type" not in params and "type" not in params:
        raise ValueError("rope_parameters should have a 'rope_type' key")
    text.update(rope_theta=theta, rope_parameters=params)
    return EngineHFConfig(data)


def install_config(monkeypatch) -> None:
    """`vllm.transformers_utils.config.get_config`, for a fake `vllm` module put in sys.modules."""
    monkeypatch.setitem(sys.modules, "vllm.transformers_utils", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm.transformers_utils.config", types.SimpleNamespace(get_config=get_config))


def install(monkeypatch, engine: FakeLLMEngine | None = None) -> dict:
    """Puts a fake `vllm` module in sys.modules: `vllm.LLM(**kwargs)` records its keywords under "init" and serves
    `engine` as `llm_engine` and one FakeTokenizer; returns the dict of what was built."""
    built = {"engine": engine or FakeLLMEngine(), "tokenizer": FakeTokenizer()}

    class LLM:
        def __init__(self, **kwargs):
            built["init"] = kwargs
            self.llm_engine = built["engine"]
            self.llm_engine.engine_args = kwargs

        def get_tokenizer(self):
            return built["tokenizer"]

    module = types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams, RequestOutputKind=RequestOutputKind)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm.lora.request", types.SimpleNamespace(LoRARequest=LoRARequest))
    install_config(monkeypatch)
    return built
