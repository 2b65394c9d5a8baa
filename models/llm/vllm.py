"""In-process vLLM: the competition path (4-bit 70B, tensor parallel over 4 T4s). Imported only when chosen.

The release it is written for, and why that one: docs/decisions/vllm-pin.md.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from loguru import logger

from models.config import VLLMConfig, resolve_path
from models.llm.backend import DEADLINE, LENGTH, STOP, BackendUnavailable, Conversation, GenParams, Sample, TopLogprobs
from models.llm.hf import RETRIEVAL_TOKEN, resolve_model_folder
from models.llm.profile import ModelProfile, engine_dtype
from utils.model_folders import FolderError, check_folder, forward_mismatches
from utils.servers import ENGINE_ON_LOOPBACK
from utils.token_cut import kept_spans

# The input embedding matrix (vocabulary x hidden) of Llama-family folders. Quantizers leave it in 16 bits:
# llm-compressor quantizes Linear layers only (embed_tokens is an Embedding), GPTQ folders likewise.
EMBEDDING_TENSOR = "model.embed_tokens.weight"
TORCH_DTYPES = {"float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
                "float32": torch.float32, "float": torch.float32}


def load_input_embeddings(folder: str | Path, dtype: str = "auto") -> torch.Tensor:
    """The model's input embedding matrix, read alone from the folder's safetensors (the shard that holds it, by
    model.safetensors.index.json when there is one) into host memory, in `dtype` ("auto": as stored)."""
    from safetensors import safe_open

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shard = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).get(EMBEDDING_TENSOR)
        files = [folder / shard] if shard else []
    else:
        files = sorted(folder.glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            if EMBEDDING_TENSOR in handle.keys():
                table = handle.get_tensor(EMBEDDING_TENSOR)
                break
    else:
        raise BackendUnavailable(f"{folder}: no {EMBEDDING_TENSOR} in its safetensors; llm.vllm.enable_prompt_embeds "
                                 "(R2AG prompt mode) needs the model's input embeddings")
    if table.ndim != 2 or not table.is_floating_point():
        raise BackendUnavailable(f"{folder}: {EMBEDDING_TENSOR} is {tuple(table.shape)} {table.dtype}, not a "
                                 "floating-point vocabulary x hidden matrix")
    return table.to(TORCH_DTYPES[dtype]) if dtype in TORCH_DTYPES else table


def embeds_prompt(tokenizer, table: torch.Tensor, conversation: Conversation, rows: np.ndarray,
                  chat_template: str | None = None) -> dict:
    """vLLM's EmbedsPrompt for `conversation`: the chat template's text, cut at each retrieval placeholder, each
    piece tokenized as the template's tokenization would (add_special_tokens=False) and looked up in `table`;
    the k-th placeholder's position takes rows[k] (a count mismatch is a ValueError)."""
    template = {} if chat_template is None else {"chat_template": chat_template}
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False, **template)
    pieces = text.split(RETRIEVAL_TOKEN)
    if len(pieces) - 1 != len(rows):
        raise ValueError(f"{len(pieces) - 1} retrieval placeholders in the prompt, {len(rows)} embeddings")
    if rows.ndim != 2 or rows.shape[1] != table.shape[1]:  # vLLM would crash on it (ModelConfig.enable_prompt_embeds)
        raise ValueError(f"retrieval embeddings of shape {rows.shape}, the model's hidden size is {table.shape[1]}")
    ids: list[int] = []
    slots: list[int] = []
    for k, piece in enumerate(pieces):
        if k:
            slots.append(len(ids))
            ids.append(0)  # the placeholder's row, overwritten below
        ids.extend(tokenizer.encode(piece, add_special_tokens=False))
    if max(ids, default=0) >= table.shape[0]:
        raise ValueError(f"token id {max(ids)} is outside the {table.shape[0]}-row input embedding matrix")
    embeds = table[torch.tensor(ids, dtype=torch.long)]
    embeds[slots] = torch.as_tensor(rows, dtype=table.dtype)
    return {"prompt_embeds": embeds}


# The LoRA ranks the pinned release takes (vllm/config/lora.py MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank(adapter: str | Path) -> int:
    """The smallest rank the engine takes that holds the adapter's (its adapter_config.json `r`)."""
    path = Path(adapter) / "adapter_config.json"
    try:
        rank = int(json.loads(path.read_text(encoding="utf-8"))["r"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BackendUnavailable(f"llm.vllm.lora {adapter}: no readable adapter_config.json with a rank `r` ({err}); "
                                 "give the adapter/ folder tools/train_llm.py train writes") from None
    fitting = [r for r in LORA_RANKS if r >= rank]
    if not fitting:
        raise BackendUnavailable(f"llm.vllm.lora {adapter}: rank {rank} is over the engine's {LORA_RANKS[-1]}")
    return fitting[0]


def engine_kwargs(config: VLLMConfig, profile: ModelProfile, folder: str | Path) -> dict:
    """The keywords VLLMBackend gives `vllm.LLM` (which passes them on to the release's EngineArgs): the profile's
    model in `folder`, on the config's hardware."""
    kwargs = {"model": str(folder), "tensor_parallel_size": config.tensor_parallel_size,
              "quantization": profile.quantization, "dtype": engine_dtype(profile, config),
              "max_model_len": profile.max_model_len, "gpu_memory_utilization": config.gpu_memory_utilization,
              "enforce_eager": config.enforce_eager, "seed": config.seed, "kv_cache_dtype": config.kv_cache_dtype,
              "enable_prompt_embeds": config.enable_prompt_embeds}
    if profile.tokenizer:
        kwargs["tokenizer"] = str(resolve_path(profile.tokenizer))
    if config.lora:
        kwargs.update(enable_lora=True, max_lora_rank=lora_rank(config.lora), max_loras=1)
    return kwargs


def check_engine_config(folder: str | Path) -> None:
    """Before the engine starts: the folder's config.json by the rule transformers 4 needs (utils/model_folders.py,
    with its fix), then the config vLLM will build the model from (its get_config, RoPE patched) against it, so
    that a folder the engine would read as another model is refused, not served. A folder that is not local (the
    engine's own error says why) is left to the engine."""
    path = Path(folder)
    if not (path / "config.json").is_file():
        return
    from vllm.transformers_utils.config import get_config

    check_folder(path)
    written = json.loads((path / "config.json").read_text(encoding="utf-8"))
    engine = get_config(str(path), trust_remote_code=False).to_dict()
    found = forward_mismatches(written, engine)
    if found:
        key, mine, theirs = found[0]
        raise FolderError(f"{path}/config.json: {key} is {mine!r}, but vLLM would build the model with {theirs!r}; "
                          "write the keys its transformers 4 reads (`python tools/model_folder.py portable --model "
                          f"{path}` writes the RoPE's)")


class VLLMBackend:
    def __init__(self, config: VLLMConfig, profile: ModelProfile) -> None:
        try:
            import vllm
        except ImportError as err:
            raise BackendUnavailable("vllm is not installed: use requirements.txt on a CUDA machine, "
                                     "or choose llm.backend hf or openai") from err
        self._vllm = vllm
        self.profile = profile
        folder = resolve_model_folder(profile)
        self._template = profile.chat_template_text()
        check_engine_config(folder)
        started = time.perf_counter()
        # Read before the engine starts, so that a folder without it fails before minutes of loading.
        self._table = (load_input_embeddings(folder, engine_dtype(profile, config)) if config.enable_prompt_embeds
                       else None)
        for key, value in ENGINE_ON_LOOPBACK.items():  # the engine core inherits it; a user's own setting stays
            os.environ.setdefault(key, value)
        self.engine = vllm.LLM(**engine_kwargs(config, profile, folder))
        self._lora = None
        if config.lora:
            from vllm.lora.request import LoRARequest

            self._lora = LoRARequest("adapter", 1, str(config.lora))
        self._requests = itertools.count()  # request ids, unique for the engine's life
        self.closed = False
        # The engine core is a child process: it is stopped while the interpreter is whole (atexit hooks run before
        # the weakref finalizers vLLM leaves it to), as the grader never calls close.
        atexit.register(self.close)
        logger.info("vllm model {} loaded in {:.1f} s{}", folder, time.perf_counter() - started,
                    "" if self._table is None else f"; input embeddings {tuple(self._table.shape)} "
                    f"{self._table.dtype} in host memory ({self._table.nbytes / 1e9:.2f} GB) for R2AG")

    def close(self) -> None:
        """Stops the engine core process (vllm/v1/engine/core_client.py: the client's shutdown runs its
        BackgroundResources finalizer once; a second call does nothing)."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        self.engine.llm_engine.engine_core.shutdown()

    # R2AG (models/resources.py asks isinstance(llm, TakesEmbeddings)): only with enable_prompt_embeds on; without
    # it these raise AttributeError, so the backend is not one and R2AG falls back to relevance mode, logged.
    @property
    def generate_with_embeddings(self):
        return self._with_table(self._generate_with_embeddings)

    @property
    def hidden_size(self) -> int:
        return int(self._with_table(self._table).shape[1])

    def _with_table(self, value):
        if self._table is None:
            raise AttributeError("R2AG prompt mode through vLLM needs llm.vllm.enable_prompt_embeds: true")
        return value

    def retrieval_placeholder(self) -> str:
        """The text that marks where a retrieval embedding goes; cut out before tokenization (not a vocabulary
        entry: the engine's tokenizer is the model folder's)."""
        return RETRIEVAL_TOKEN

    def sampling_params(self, params: GenParams):
        return self._vllm.SamplingParams(n=params.n, temperature=params.temperature, max_tokens=params.max_tokens,
                                         stop=params.stop or None, seed=params.seed,
                                         logprobs=params.top_logprobs if params.logprobs or params.top_logprobs
                                         else None)

    def generate(self, conversations: Sequence[Conversation], params: GenParams) -> list[list[Sample]]:
        """Prompts are the tokenizer's chat template, as token ids (a string would get a second BOS)."""
        if self._unservable(params, len(conversations)):
            return [[] for _ in conversations]
        tokenizer = self.engine.get_tokenizer()
        return self._run([{"prompt_token_ids": self._prompt_ids(tokenizer, c)} for c in conversations], params)

    def _prompt_ids(self, tokenizer, conversation: Conversation) -> list[int]:
        """The conversation's chat-templated ids (the profile's template where it names one), cut to its
        prompt_tokens with the head and tail kept, as the hf backend cuts."""
        template = {} if self._template is None else {"chat_template": self._template}
        ids = list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                              return_dict=False, **template))
        spans = kept_spans(len(ids), self.profile.prompt_tokens)
        if len(spans) > 1:
            logger.warning("prompt of {} tokens cut to {}", len(ids), self.profile.prompt_tokens)
        return [token for span in spans for token in ids[span]]

    def _generate_with_embeddings(self, conversations: Sequence[Conversation], embeddings: list[np.ndarray],
                                  params: GenParams) -> list[list[Sample]]:
        """Like generate, with the k-th retrieval placeholder of conversation i replaced by embeddings[i][k] (rows
        of the model's hidden size): the whole prompt goes as input embeddings (vLLM's prompt_embeds). A
        conversation without placeholders goes as token ids."""
        if self._unservable(params, len(conversations)):
            return [[] for _ in conversations]
        tokenizer = self.engine.get_tokenizer()
        table = self._with_table(self._table)  # reached through generate_with_embeddings, which checked it
        prompts = []
        for conversation, rows in zip(conversations, embeddings):
            rows = np.asarray(rows, dtype=np.float32)
            if rows.size or any(RETRIEVAL_TOKEN in message["content"] for message in conversation):
                rows = rows.reshape(len(rows), -1) if rows.size else rows.reshape(0, table.shape[1])
                prompts.append(embeds_prompt(tokenizer, table, conversation, rows, self._template))
            else:
                prompts.append({"prompt_token_ids": self._prompt_ids(tokenizer, conversation)})
        return self._run(prompts, params)

    def _unservable(self, params: GenParams, count: int) -> bool:
        if self.closed:
            raise BackendUnavailable("the vllm engine was shut down (VLLMBackend.close); build a new backend")
        if params.deadline is not None and params.deadline.expired():
            logger.warning("deadline reached: {} conversations not generated", count)
            return True
        return False

    def _run(self, prompts: list[dict], params: GenParams) -> list[list[Sample]]:
        """The engine driven request by request: every prompt is added, the engine stepped while any is
        unfinished, and at the deadline the unfinished ones are aborted and keep the text they had (cut short:
        DEADLINE), so a slow batch returns what finished instead of outrunning its limit in one blocking call. A
        prompt the engine refuses (longer than max_model_len) gets no sample."""
        engine, sampling = self.engine.llm_engine, self.sampling_params(params)
        ids: list[str | None] = []
        for prompt in prompts:
            request_id = f"crag-{next(self._requests)}"
            try:
                engine.add_request(request_id, prompt, sampling, lora_request=self._lora)
            except ValueError as err:
                logger.warning("vllm refused prompt {}: {}", request_id, " ".join(str(err).split())[:200])
                ids.append(None)
                continue
            ids.append(request_id)
        # SamplingParams' default output kind (CUMULATIVE): each RequestOutput carries whole texts so far, but with
        # n > 1 only one child's (its `index`), and a finished child is not sent again (ParentRequest.get_outputs,
        # vllm/v1/engine/parallel_sampling.py), so samples are kept per request and index.
        samples: dict[str, dict[int, Any]] = {}  # vLLM's CompletionOutput
        finished: set[str] = set()
        while engine.has_unfinished_requests():
            if params.deadline is not None and params.deadline.expired():
                cut = [i for i in ids if i is not None and i not in finished]
                engine.abort_request(cut)  # a parent's id aborts its children
                logger.warning("deadline reached: {} of {} requests aborted, their text so far kept", len(cut),
                               len(ids))
                break
            for output in engine.step():
                samples.setdefault(output.request_id, {}).update((c.index, c) for c in output.outputs)
                if output.finished:
                    finished.add(output.request_id)
        return [[Sample(choice.text.strip(), _finish(choice), top_logprobs(choice.logprobs, params.top_logprobs),
                        *chosen(choice)) for _, choice in sorted(samples.get(i, {}).items())] if i is not None else []
                for i in ids]


def _finish(choice) -> str:
    """A sample's own finish reason: a child still running when its request was aborted has none."""
    if choice.finish_reason is None:
        return DEADLINE
    return LENGTH if choice.finish_reason == "length" else STOP


def top_logprobs(steps, k: int) -> TopLogprobs:
    """vLLM's per-token entries ({token id: Logprob(logprob, rank, decoded_token)}, or None where not asked for)
    as the k most likely tokens' text -> log-probability (an entry also holds the sampled token, whatever its
    rank: vllm/v1/engine/logprobs.py)."""
    return tuple({alt.decoded_token: alt.logprob for alt in step.values()
                  if alt.decoded_token is not None and alt.rank is not None and alt.rank <= k}
                 for step in steps or ()) if k else ()


def chosen(choice) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The generated tokens' text and log-probabilities: each step's entry for the sampled token id."""
    if not choice.logprobs:
        return (), ()
    entries = [step[token] for token, step in zip(choice.token_ids, choice.logprobs) if token in step]
    return tuple(e.decoded_token or "" for e in entries), tuple(float(e.logprob) for e in entries)
