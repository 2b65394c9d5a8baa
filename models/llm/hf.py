"""transformers backend: the embedded CPU default (SmolLM2 from a GGUF file), also usable on CUDA."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from loguru import logger
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList
from transformers.utils import logging as hf_logging

from models.config import HFConfig
from models.llm.backend import (
    DEADLINE,
    LENGTH,
    STOP,
    BackendUnavailable,
    Conversation,
    GenParams,
    Sample,
    TopLogprobs,
    cut_at_stop,
)
from models.llm.profile import ModelProfile, load_profile, load_tokenizer
from models.llm.weights import FOLDER_FORMAT
from utils.cache import cache_root
from utils.model_folders import portable_folder
from utils.time_budget import Deadline
from utils.token_cut import kept_spans

RETRIEVAL_TOKEN = "<|retrieval|>"  # R2AG: where a retrieval embedding enters the prompt


def _fingerprint(path: Path) -> str:
    """Content key from the size and the first and last MiB: cheap for big files, changes with the file."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def converted_folder(gguf: Path, cache_dir: str | None) -> Path:
    """A plain HF folder for `gguf`, converted (de-quantised) once and then reused from the cache."""
    target = cache_root(cache_dir) / "hf" / f"{gguf.stem}-{_fingerprint(gguf)}-{FOLDER_FORMAT}"
    if (target / "config.json").is_file():
        return target
    logger.info("converting {} to an HF folder under {} (once; later runs reuse it)", gguf.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    model: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are de-quantised at load; drop the GGUF marker so the folder saves as plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        portable_folder(staging)  # the submission's transformers 4 loads the same model
        os.replace(staging, target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
        logger.info("another process converted {} first", gguf.name)  # the rename lost a race: theirs is fine
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model_folder(profile: ModelProfile | None = None, cache_dir: str | None = None) -> Path:
    """The HF folder of the profile's weights (default: the default profile's): a .gguf converted once under
    `cache_dir`, or the folder itself."""
    profile = profile or load_profile()
    path = profile.weights_path()
    if path.suffix == ".gguf" and path.is_file():
        return converted_folder(path, cache_dir)
    if (path / "config.json").is_file():
        return path
    raise BackendUnavailable(f"{profile.source or profile.name}: weights {path} are neither a .gguf file nor an HF "
                             "folder with config.json")


MIN_PROMPT_TOKENS = 256  # a micro-batch that cannot read this much of each prompt before its deadline is not started
PREFILL_SHARE = 0.4  # of the time left, what reading the prompts may take; decoding gets the rest
WARMUP_TOKENS = 1024  # the prompt read at load to measure the rate
# A generation that read fewer prompt tokens does not update the measured rate: a short read times the forward
# pass's fixed cost more than the rate. One full chunk (PREFILL_CHUNK_MAX) is enough
# (docs/decisions/hf-deadline-clock.md).
RATE_MIN_TOKENS = 512
STEP_WINDOW = 4  # the next decoding step is expected to take as long as the slowest of the last STEP_WINDOW
PREFILL_CHUNK_S = 0.5  # prompts are read in chunks of about this many seconds, the deadline checked between them
PREFILL_CHUNK_MIN = 32  # positions: smaller chunks spend more on each forward pass's overhead than they save
# The most positions x rows in one chunk, whatever the measured rate promises: a rate measured on a quieter machine
# or on shorter prompts must not make the whole prompt one chunk. A GPU gets a larger cap, as small chunks read
# slowly there (docs/decisions/hf-deadline-clock.md).
PREFILL_CHUNK_MAX = 512
PREFILL_CHUNK_MAX_GPU = 8192


class OutOfTime(Exception):
    """The deadline cannot afford the next chunk of the prompts: the generation is given up before it decodes."""


class _DeadlineClock(StoppingCriteria):
    """Times a generation and ends it in time.

    Reading the prompts: transformers reads them in chunks (`prefill_chunk_size`) and `before_forward`, a forward
    pre-hook, is called before each chunk; when the deadline leaves less time than the chunk needs at the rate of
    the chunks read so far (at first, the backend's measured rate), it raises OutOfTime. The admission in
    `HFBackend._generate` plans for the prompts to take PREFILL_SHARE of the time left; this is the guard for a
    machine that got slower since the rate was measured.

    Decoding: the first call as a stopping criterion comes when the prompts have been read; each later call ends
    one step. Decoding stops when the deadline leaves less than the next step is expected to take: the slowest of
    the recent steps, starting from the previous generation's. transformers' own `max_time` stops only once the
    time is up, one step late, and on a busy CPU one step of a batch can take seconds (the threads of every matrix
    product wait for each other). Why and how it was measured: docs/decisions/hf-deadline-clock.md."""

    def __init__(self, deadline: Deadline | None, step_s: float, prefill_tps: float,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.deadline, self.step_s, self.prefill_tps, self._clock = deadline, step_s, prefill_tps, clock
        self.started = self.last = clock()
        self.first_token_s: float | None = None  # from the first forward pass (else from construction)
        self.read_from: float | None = None  # when the first forward pass began: generate's set-up is not reading
        self.prompt_tokens, self.read_s = 0, 0.0  # of the prompts: tokens read and seconds taken, chunk by chunk
        self._chunk: tuple[int, float] | None = None  # the last chunk's tokens and when it began
        self.steps: list[float] = []

    def before_forward(self, tokens: int) -> None:
        """Called before each forward pass of `tokens` new positions x rows; raises OutOfTime when a chunk of the
        prompts cannot be read before the deadline."""
        if self.first_token_s is not None or self.deadline is None:
            return  # decoding: the stopping criterion decides
        now = self._clock()
        if self.read_from is None:
            self.read_from = now
        self.read_s = elapsed = now - self.read_from  # the chunks before this one are read
        rate = self.prompt_tokens / elapsed if self.prompt_tokens and elapsed > 0 else self.prefill_tps
        if self._chunk is not None and now > self._chunk[1]:
            # a chunk attends to all the chunks before it, so later chunks read slower than the average, and the
            # average alone admits a last chunk that ends past the deadline
            rate = min(rate, self._chunk[0] / (now - self._chunk[1]))
        if self.deadline.remaining() < tokens / max(rate, 1e-6):
            raise OutOfTime(f"{self.deadline.remaining():.1f} s left; {tokens} prompt tokens to read at "
                            f"{rate:.0f} tokens/s")
        self.prompt_tokens += tokens
        self._chunk = (tokens, now)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        now = self._clock()
        if self.first_token_s is None:
            self.first_token_s = now - (self.started if self.read_from is None else self.read_from)
        else:
            self.steps.append(now - self.last)
            self.step_s = max(self.steps[-STEP_WINDOW:])
        self.last = now
        late = self.deadline is not None and self.deadline.remaining() < self.step_s
        return torch.full((input_ids.shape[0],), late, dtype=torch.bool, device=input_ids.device)


def device_clock(device: str | torch.device) -> Callable[[], float]:
    """`time.perf_counter`, read once the device has run the work queued on it. CUDA kernels run asynchronously: a
    host clock read straight after a forward pass times its launch, not its run, so a prefill rate measured that way
    is that of the launches, and the deadline admits prompts the GPU cannot read in time."""
    device = torch.device(device)
    if device.type != "cuda":
        return time.perf_counter

    def now() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return now


def _short(conversations: Sequence[Conversation]) -> bool:
    """Every conversation surely shorter than MIN_PROMPT_TOKENS tokens, by its characters (a token of text has at
    least one; the chat template's own tokens are left out): short prompts go while the deadline has not passed."""
    return all(sum(len(str(turn.get("content") or "")) for turn in conversation) < MIN_PROMPT_TOKENS // 2
               for conversation in conversations)


def _new_tokens(kwargs: dict[str, object]) -> int:
    """The positions x rows a forward pass of the causal LM reads (from its input_ids or inputs_embeds)."""
    for name in ("input_ids", "inputs_embeds"):
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor):
            return int(value.shape[0] * value.shape[1])
    return 0


class HFBackend:
    def __init__(self, config: HFConfig, profile: ModelProfile | None = None) -> None:
        self.config = config
        self.profile = profile = profile or load_profile()
        started = time.perf_counter()
        hf_logging.disable_progress_bar()  # load time is logged below; per-tensor bars only clutter stderr
        self.folder = resolve_model_folder(profile, config.cache_dir)
        # Any: transformers' annotations do not say what these objects' calls return (BatchEncoding or list[int],
        # tensors or tuples), so the code below states it where it reads them
        self.tokenizer: Any = load_tokenizer(self.folder, profile)
        if self.tokenizer.chat_template is None:
            raise BackendUnavailable(f"{self.folder}: the tokenizer has no chat template")
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        loaded: Any = AutoModelForCausalLM.from_pretrained(self.folder, dtype=getattr(torch, config.dtype))
        self.model: Any = loaded.to(config.device).eval()
        self._now = device_clock(config.device)  # every time this backend measures, on the device's clock
        # R2AG's placeholder token id, once it is in the vocabulary (a folder saved with it has it already).
        self._retrieval_id: int | None = self.tokenizer.get_vocab().get(RETRIEVAL_TOKEN)
        self._prefill_tps = self._measure_prefill()  # prompt tokens read per second (a moving average)
        self._step_s = 0.0  # the slowest of the last decoding steps of the previous generation
        logger.info("hf model {} loaded in {:.2f} s; reads {:.0f} prompt tokens/s", self.folder.name,
                    time.perf_counter() - started, self._prefill_tps)

    @property
    def hidden_size(self) -> int:
        return int(self.model.get_input_embeddings().embedding_dim)

    def retrieval_placeholder(self) -> str:
        """The token that stands where a retrieval embedding goes (R2AG). Added to the vocabulary on first use; its
        own embedding is never seen, since injection overwrites it, and generation never emits it."""
        if self._retrieval_id is None:
            self.tokenizer.add_tokens([RETRIEVAL_TOKEN], special_tokens=True)
            self.model.resize_token_embeddings(len(self.tokenizer), mean_resizing=False)
            self._retrieval_id = int(self.tokenizer.convert_tokens_to_ids(RETRIEVAL_TOKEN))
        return RETRIEVAL_TOKEN

    def generate(self, conversations: Sequence[Conversation], params: GenParams) -> list[list[Sample]]:
        return self._generate(conversations, None, params)

    def generate_with_embeddings(self, conversations: Sequence[Conversation], embeddings: list[np.ndarray],
                                 params: GenParams) -> list[list[Sample]]:
        """Like generate, with the k-th retrieval placeholder of conversation i replaced by embeddings[i][k]
        (rows of the model's hidden size) at the input-embedding layer."""
        return self._generate(conversations, embeddings, params)

    def _generate(self, conversations: Sequence[Conversation], embeddings: list[np.ndarray] | None,
                  params: GenParams) -> list[list[Sample]]:
        """Micro-batch by micro-batch, each admitted only if the deadline affords reading its prompts.

        `_DeadlineClock` stops the decoding and gives up a read the deadline cannot finish, but a prompt read past
        its share leaves no time to decode. So the prompts of a micro-batch are cut (head and tail kept, as for
        prompt_tokens) to what PREFILL_SHARE of the time left can read at the measured prefill rate when they are
        longer (counted padded, rows x the longest, as the forward pass reads them), and a micro-batch that could
        not read even MIN_PROMPT_TOKENS each is not started (decided before encoding, which takes time too): those
        conversations get no sample. Prompts of at most MIN_PROMPT_TOKENS always go while the deadline has not
        passed."""
        outputs: list[list[Sample]] = []
        step = max(1, self.config.micro_batch_size)
        n_run = params.n if params.temperature > 0 else 1

        def give_up(count: int, affordable: float) -> None:
            left = params.deadline.remaining() if params.deadline is not None else 0.0
            logger.warning("deadline: {:.2f} s left reads {:.0f} prompt tokens at {:.0f} tokens/s; {} conversations "
                           "not generated", left, affordable, self._prefill_tps, count)
            outputs.extend([] for _ in range(count))

        for start in range(0, len(conversations), step):
            part = slice(start, start + step)
            count, rows = len(conversations[part]), None if embeddings is None else embeddings[part]
            affordable = 0.0 if params.deadline is None else \
                self._prefill_tps * max(params.deadline.remaining(), 0.0) * PREFILL_SHARE / n_run
            if params.deadline is not None and (params.deadline.expired() or (
                    affordable / count < MIN_PROMPT_TOKENS and not _short(conversations[part]))):
                # decided before encoding: templating and tokenising long prompts takes time the deadline may not
                # have (docs/decisions/hf-deadline-clock.md)
                give_up(count, affordable)
                continue
            inputs = self._encode(conversations[part], rows)
            if params.deadline is not None:
                height, width = inputs["attention_mask"].shape  # the padded batch is what the forward pass reads
                if height * width > affordable and width > MIN_PROMPT_TOKENS:
                    limit = int(affordable / count)
                    if limit < MIN_PROMPT_TOKENS:  # prompts of many tokens per character (byte fallback)
                        give_up(count, affordable)
                        continue
                    inputs = self._encode(conversations[part], rows, limit)
            outputs.extend(self._generate_batch(inputs, count, params))
        return outputs

    @torch.inference_mode()
    def _measure_prefill(self, tokens: int = WARMUP_TOKENS) -> float:
        """Prompt tokens read per second, from one forward pass over `tokens` tokens (at load; every generation
        then updates it)."""
        ids = torch.full((1, tokens), self.tokenizer.eos_token_id or 0, device=self.config.device)
        # The first pass pays one-time set-up costs; on a GPU the first large one does, so the warm-up is full size
        # there. On a CPU a short one is enough, and a second long one would slow every load
        # (docs/decisions/hf-deadline-clock.md).
        self.model(input_ids=ids[:, :16] if self.model.device.type == "cpu" else ids)
        started = self._now()
        self.model(input_ids=ids)
        return tokens / max(self._now() - started, 1e-6)

    def prompt_ids(self, conversation: Conversation, embeddings: np.ndarray | torch.Tensor | None = None,
                   limit: int | None = None) -> tuple[list[int], np.ndarray | torch.Tensor | None]:
        """The chat-templated ids of `conversation`, cut to `limit` (default the profile's prompt_tokens), and the
        rows of `embeddings` whose placeholders survived the cut (one row per placeholder, in order; a count mismatch
        is a ValueError)."""
        ids: list[int] = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                                            return_dict=True)["input_ids"]
        limit = limit or self.profile.prompt_tokens
        spans = kept_spans(len(ids), limit)
        if len(spans) > 1:
            logger.warning("prompt of {} tokens cut to {}", len(ids), limit)
        kept_ids = [token for span in spans for token in ids[span]]
        if embeddings is None:
            return kept_ids, None
        self.retrieval_placeholder()
        found = [i for i, token in enumerate(ids) if token == self._retrieval_id]
        if len(found) != len(embeddings):
            raise ValueError(f"{len(found)} retrieval placeholders in the prompt, {len(embeddings)} embeddings")
        rows = [k for k, i in enumerate(found) if any(span.start <= i < span.stop for span in spans)]
        return kept_ids, embeddings[rows]

    def inject(self, input_ids: torch.Tensor, embeddings: list[torch.Tensor]) -> torch.Tensor:
        """Input embeddings of `input_ids` (B, T) with the retrieval placeholders of row b overwritten, in order,
        by the rows of embeddings[b]; differentiable in `embeddings` (R2-Former training)."""
        self.retrieval_placeholder()
        assert self._retrieval_id is not None  # retrieval_placeholder() set it
        embeds = self.model.get_input_embeddings()(input_ids)
        mask = torch.eq(input_ids, self._retrieval_id)
        source = torch.cat([e.reshape(-1, embeds.shape[-1]) for e in embeddings]) if embeddings else embeds[:0, 0]
        if int(mask.sum()) != source.shape[0]:
            raise ValueError(f"{int(mask.sum())} retrieval placeholders in the batch, {source.shape[0]} embeddings")
        return embeds.masked_scatter(mask[..., None], source.to(embeds.device, embeds.dtype))

    def _encode(self, conversations: Sequence[Conversation], embeddings: list[np.ndarray] | None,
                limit: int | None = None) -> dict[str, torch.Tensor]:
        rows_in: list[np.ndarray | None] = list(embeddings) if embeddings is not None else [None] * len(conversations)
        fitted = [self.prompt_ids(c, None if e is None else np.asarray(e, dtype=np.float32), limit)
                  for c, e in zip(conversations, rows_in)]
        padded = self.tokenizer.pad({"input_ids": [ids for ids, _ in fitted]}, padding=True, return_tensors="pt")
        batch: dict[str, torch.Tensor] = {k: v.to(self.config.device) for k, v in padded.items()}
        if embeddings is None:
            return batch
        rows = [torch.from_numpy(e) for _, e in fitted]
        return {"inputs_embeds": self.inject(batch["input_ids"], rows), "attention_mask": batch["attention_mask"]}

    @torch.inference_mode()
    def _generate_batch(self, inputs: dict[str, torch.Tensor], size: int, params: GenParams) -> list[list[Sample]]:
        sample = params.temperature > 0
        n_run = params.n if sample else 1  # greedy decoding gives n identical samples: decode once
        if params.seed is not None:
            torch.manual_seed(params.seed)
        extra: dict[str, object] = {}
        if params.stop:
            extra.update(stop_strings=params.stop, tokenizer=self.tokenizer)
        if self._retrieval_id is not None:
            extra["suppress_tokens"] = [self._retrieval_id]
        clock = _DeadlineClock(params.deadline, self._step_s, self._prefill_tps, self._now)
        scored = params.logprobs or params.top_logprobs > 0
        if scored:  # the raw logits of every step: the generated tokens' log-probabilities and the most likely ones
            extra.update(return_dict_in_generate=True, output_logits=True)
        rows, width = inputs["attention_mask"].shape
        if "input_ids" in inputs and params.deadline is not None:  # read in chunks the deadline can stop between
            planned = int(self._prefill_tps * PREFILL_CHUNK_S / (rows * n_run))
            cap = PREFILL_CHUNK_MAX if self.model.device.type == "cpu" else PREFILL_CHUNK_MAX_GPU
            extra["prefill_chunk_size"] = max(min(planned, cap // (rows * n_run)), PREFILL_CHUNK_MIN)
        hook = self.model.register_forward_pre_hook(
            lambda module, args, kwargs: clock.before_forward(_new_tokens(kwargs)), with_kwargs=True)
        try:
            output = self.model.generate(
                **inputs, max_new_tokens=params.max_tokens, do_sample=sample,
                temperature=params.temperature if sample else None, top_p=None, top_k=None,
                num_return_sequences=n_run, pad_token_id=self.tokenizer.pad_token_id,
                stopping_criteria=StoppingCriteriaList([clock]), **extra)
        except OutOfTime as reason:
            logger.warning("deadline: {} rows given up while reading their prompts ({})", size, reason)
            self._learn_prefill_rate(clock.prompt_tokens, clock.read_s)  # what the chunks before it showed
            return [[] for _ in range(size)]
        finally:
            hook.remove()
        self._step_s = clock.step_s
        self._learn_prefill_rate(rows * width * n_run, clock.first_token_s)  # padded, read once per sample
        generated = output.sequences if scored else output
        # From input ids, generate returns prompt and continuation; from input embeddings, the continuation only.
        prompt_length = inputs["input_ids"].shape[1] if "input_ids" in inputs else 0
        continuation = generated[:, prompt_length:]
        texts = self.tokenizer.batch_decode(continuation, skip_special_tokens=True)
        ran_out = LENGTH if continuation.shape[1] >= params.max_tokens else DEADLINE  # else the clock stopped it
        ends = self._end_ids()
        scores = self._logprobs(output.logits, continuation, ends, params.top_logprobs) if scored \
            else [((), (), ())] * len(texts)
        samples = [Sample(cut_at_stop(text, params.stop).strip(),
                          STOP if bool(torch.isin(row, ends).any()) or any(s and s in text for s in params.stop)
                          else ran_out, *score) for text, row, score in zip(texts, continuation, scores)]
        return [samples[i * n_run:(i + 1) * n_run] * (params.n // n_run) for i in range(size)]

    def _learn_prefill_rate(self, tokens: int, seconds: float | None) -> None:
        """Update the prompt-reading rate from `tokens` read in `seconds`. Short reads time the overhead, not the
        rate, and are ignored. A machine that got busier is believed at once (a stale rate overruns the very next
        call); one that got quieter only half-way per generation."""
        if seconds is None or tokens < RATE_MIN_TOKENS:
            return
        rate = tokens / max(seconds, 1e-6)
        self._prefill_tps = rate if rate < self._prefill_tps else 0.5 * (self._prefill_tps + rate)

    def _logprobs(self, logits: tuple[torch.Tensor, ...], continuation: torch.Tensor, ends: torch.Tensor,
                  k: int) -> list[tuple[TopLogprobs, tuple[str, ...], tuple[float, ...]]]:
        """Per row, for each token up to the row's end, under the model's raw distribution (log-softmax of the
        logits, before temperature): the k most likely tokens (decoded) with their log-probabilities, and the
        generated token (decoded) with its own, which sampling need not have taken from the top k."""
        steps = torch.stack(logits, dim=1).float().log_softmax(dim=-1)  # rows x steps x vocabulary
        own = steps.gather(-1, continuation[:, :steps.shape[1]].unsqueeze(-1)).squeeze(-1).tolist()
        top = steps.topk(k, dim=-1) if k else None
        rows = []
        for index, row in enumerate(continuation):
            ended = torch.isin(row, ends).nonzero()
            length = min(int(ended[0]) + 1 if len(ended) else steps.shape[1], steps.shape[1])
            alternatives = () if top is None else tuple(
                {self.tokenizer.decode([i]): v for i, v in zip(ids, values)}
                for ids, values in zip(top.indices[index, :length].tolist(), top.values[index, :length].tolist()))
            tokens = tuple(self.tokenizer.decode([i]) for i in row[:length].tolist())
            rows.append((alternatives, tokens, tuple(own[index][:length])))
        return rows

    def _end_ids(self) -> torch.Tensor:
        """The ids that end a sequence (the generation config's EOS ids and the padding a finished row gets)."""
        eos = self.model.generation_config.eos_token_id
        ids = {*([] if eos is None else [eos] if isinstance(eos, int) else eos), self.tokenizer.pad_token_id}
        return torch.tensor(sorted(i for i in ids if i is not None), device=self.config.device)
