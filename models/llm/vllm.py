"""In-process vLLM: the competition path (GPTQ 70B, tensor parallel over 4 T4s). Imported only when chosen."""

from __future__ import annotations

import time

from loguru import logger

from models.config import VLLMConfig
from models.llm.base import LENGTH, STOP, BackendUnavailable, Conversation, GenParams, Sample, TopLogprobs


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
        logger.info("vllm model {} loaded in {:.1f} s", config.model, time.perf_counter() - started)

    def sampling_params(self, params: GenParams):
        return self._vllm.SamplingParams(n=params.n, temperature=params.temperature, max_tokens=params.max_tokens,
                                         stop=params.stop or None, seed=params.seed,
                                         logprobs=params.top_logprobs or None)

    def generate(self, conversations: list[Conversation], params: GenParams) -> list[list[str]]:
        # vLLM runs a whole batch to completion and cannot be interrupted: the stages size their token
        # budgets to the deadline, and an already expired deadline sends nothing.
        if params.deadline is not None and params.deadline.expired():
            logger.warning("deadline reached: {} conversations not generated", len(conversations))
            return [[] for _ in conversations]
        results = self.engine.chat(conversations, self.sampling_params(params), use_tqdm=False)
        return [[Sample(choice.text.strip(), LENGTH if choice.finish_reason == "length" else STOP,
                        top_logprobs(choice.logprobs)) for choice in result.outputs] for result in results]


def top_logprobs(steps) -> TopLogprobs:
    """vLLM's per-token alternatives ({token id: Logprob(logprob, rank, decoded_token)}, or None where not
    asked for) as token text -> log-probability."""
    return tuple({alt.decoded_token: alt.logprob for alt in step.values() if alt.decoded_token is not None}
                 for step in steps or ())
