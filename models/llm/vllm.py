"""In-process vLLM: the competition path (GPTQ 70B, tensor parallel over 4 T4s). Imported only when chosen."""

from __future__ import annotations

import itertools
import time

from loguru import logger

from models.config import VLLMConfig
from models.llm.base import DEADLINE, LENGTH, STOP, BackendUnavailable, Conversation, GenParams, Sample, TopLogprobs


class VLLMBackend:
    def __init__(self, config: VLLMConfig) -> None:
        try:
            import vllm
        except ImportError as err:
            raise BackendUnavailable("vllm is not installed: use requirements.txt on a CUDA machine, "
                                     "or choose llm.backend hf or openai") from err
        if not config.model:
            raise BackendUnavailable("llm.vllm.model is empty: set it to the local model folder")
        self._vllm = vllm
        started = time.perf_counter()
        self.engine = vllm.LLM(
            model=config.model, tensor_parallel_size=config.tensor_parallel_size,
            quantization=config.quantization, dtype=config.dtype, max_model_len=config.max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization, enforce_eager=config.enforce_eager,
            seed=config.seed, kv_cache_dtype=config.kv_cache_dtype)
        self._requests = itertools.count()  # request ids, unique for the engine's life
        logger.info("vllm model {} loaded in {:.1f} s", config.model, time.perf_counter() - started)

    def sampling_params(self, params: GenParams):
        return self._vllm.SamplingParams(n=params.n, temperature=params.temperature, max_tokens=params.max_tokens,
                                         stop=params.stop or None, seed=params.seed,
                                         logprobs=params.top_logprobs or None)

    def generate(self, conversations: list[Conversation], params: GenParams) -> list[list[str]]:
        """The engine driven request by request: every conversation is added, the engine stepped while any is
        unfinished, and at the deadline the unfinished ones are aborted and keep the text they had (cut short:
        DEADLINE), so a slow batch returns what finished instead of outrunning its limit in one blocking call.
        Prompts are the tokenizer's chat template, as token ids (a string would get a second BOS)."""
        if params.deadline is not None and params.deadline.expired():
            logger.warning("deadline reached: {} conversations not generated", len(conversations))
            return [[] for _ in conversations]
        engine, tokenizer, sampling = self.engine.llm_engine, self.engine.get_tokenizer(), self.sampling_params(params)
        ids = [f"crag-{next(self._requests)}" for _ in conversations]
        for request_id, conversation in zip(ids, conversations):
            prompt = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
            engine.add_request(request_id, {"prompt_token_ids": list(prompt)}, sampling)
        latest = {}  # request id -> its newest RequestOutput (cumulative text)
        while engine.has_unfinished_requests():
            if params.deadline is not None and params.deadline.expired():
                cut = [i for i in ids if not (i in latest and latest[i].finished)]
                engine.abort_request(cut)
                logger.warning("deadline reached: {} of {} requests aborted, their text so far kept", len(cut),
                               len(ids))
                break
            for output in engine.step():
                latest[output.request_id] = output
        return [[Sample(choice.text.strip(), _finish(choice, latest[i].finished), top_logprobs(choice.logprobs))
                 for choice in latest[i].outputs] if i in latest else [] for i in ids]


def _finish(choice, finished: bool) -> str:
    if not finished:
        return DEADLINE
    return LENGTH if choice.finish_reason == "length" else STOP


def top_logprobs(steps) -> TopLogprobs:
    """vLLM's per-token alternatives ({token id: Logprob(logprob, rank, decoded_token)}, or None where not
    asked for) as token text -> log-probability."""
    return tuple({alt.decoded_token: alt.logprob for alt in step.values() if alt.decoded_token is not None}
                 for step in steps or ())
