"""The LLM interface every backend implements, the capabilities some backends add (each a runtime-checkable
protocol), and the reply type they share. The registry that builds one from a config is models/llm/backends.py,
which no backend imports: it imports each backend by name."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from utils.errors import BackendUnavailable as BackendUnavailable  # where the backends' callers import it
from utils.time_budget import Deadline

Conversation = list[dict[str, str]]

STOP, LENGTH, DEADLINE = "stop", "length", "deadline"
FAILED = "failed"  # no reply: the call failed (Sample.failure says why); not an answer, and a resume asks again


TopLogprobs = tuple[dict[str, float], ...]  # per generated token: the most likely tokens (text) and their log-probs


@dataclass(frozen=True)
class Sample:
    """One generated text and why generation ended: STOP (end of sequence or a stop string), LENGTH (max_tokens
    reached), DEADLINE (cut by the batch deadline) or FAILED (no reply came: `failure` says why, and the text is
    empty; use `Sample.failed`).

    Where they were asked for (`GenParams.logprobs`, `GenParams.top_logprobs`) and the backend gives them:
    `tokens` and `token_logprobs` are the generated tokens (text, in order, before the text was cut at a stop
    string and stripped) and each one's log-probability; `top_logprobs` holds, for each generated token, the
    `GenParams.top_logprobs` most likely tokens with their log-probabilities. Else they are empty."""

    text: str
    finish_reason: str = STOP
    top_logprobs: TopLogprobs = ()
    tokens: tuple[str, ...] = ()
    token_logprobs: tuple[float, ...] = ()
    failure: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"a sample's text is a str, not {type(self.text).__name__}")
        if len(self.tokens) != len(self.token_logprobs):
            raise ValueError(f"{len(self.tokens)} tokens, {len(self.token_logprobs)} log-probabilities")
        if (self.finish_reason == FAILED) != bool(self.failure) or (self.failure and self.text):
            raise ValueError("a failed sample has a failure and no text, and only a failed sample has a failure")

    @classmethod
    def failed(cls, why: str) -> Sample:
        """The sample of a call that got no reply, and why (e.g. "InternalServerError: ... after 3 attempts")."""
        return cls("", FAILED, failure=why or "no reason given")


def span_logprobs(sample: Sample, span: str) -> list[float]:
    """The log-probabilities of the generated tokens that spell `span` (its last occurrence in the generated
    text, as the stages read the last answer line): every token overlapping it. Empty where the sample carries
    no tokens or the span is not in their text."""
    tokens, logprobs = sample.tokens, sample.token_logprobs
    text = "".join(tokens)
    start = text.rfind(span) if span else -1
    if start < 0:
        return []
    end, at, chosen = start + len(span), 0, []
    for token, logprob in zip(tokens, logprobs):
        if at < end and at + len(token) > start:
            chosen.append(logprob)
        at += len(token)
    return chosen


def deadline_cut(samples: list[Sample]) -> bool:
    """Whether the batch deadline ended a call before it gave any text (an OpenAI-compatible server's reply comes
    whole or not at all)."""
    return bool(samples) and samples[0].finish_reason == DEADLINE and not samples[0].text


def failure_of(samples: list[Sample]) -> str | None:
    """Why a call got no reply (its first failed sample's `failure`), or None where none failed."""
    return next((s.failure for s in samples if s.finish_reason == FAILED), None)


def cut_short(sample: Sample, answer: str | None = None) -> str | None:
    """Why a generation ended before the model finished it (LENGTH or DEADLINE), or None when it finished, or
    when `answer` (read from its text) sits on a line that ended before the cut.

    An answer read from a text cut short may be half a sentence, so the stages answer "i don't know" instead;
    a whole answer line followed by more of the model's text is not half a sentence."""
    reason, text = sample.finish_reason, sample.text
    if reason == STOP:
        return None
    at = text.rfind(answer) if answer else -1
    return None if at >= 0 and "\n" in text[at + len(answer or ""):] else reason


@dataclass
class GenParams:
    max_tokens: int = 128
    temperature: float = 0.0
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    deadline: Deadline | None = None
    top_logprobs: int = 0  # ask for the k most likely tokens at each step (Sample.top_logprobs); 0: none
    logprobs: bool = False  # ask for the generated tokens and their log-probabilities (Sample.tokens, token_logprobs)


@runtime_checkable
class LLM(Protocol):
    def generate(self, conversations: Sequence[Conversation], params: GenParams) -> list[list[Sample]]:
        """n samples per conversation, in order; a conversation that could not be served gets []."""


@runtime_checkable
class Probed(Protocol):
    """A backend on a server, checked once at start-up: a wrong key, model or URL stops the start."""

    def probe(self) -> None:
        """One tiny request; BackendUnavailable naming the fix when it fails."""


@runtime_checkable
class TakesEmbeddings(Protocol):
    """A backend that takes input embeddings beside the text (R2AG's prompt mode: hf, and vllm with
    `llm.vllm.enable_prompt_embeds`)."""

    hidden_size: int

    def generate_with_embeddings(self, conversations: Sequence[Conversation], embeddings: list[np.ndarray],
                                 params: GenParams) -> list[list[Sample]]:
        """As `generate`, each conversation's retrieval placeholders replaced by its rows of `embeddings`."""

    def retrieval_placeholder(self) -> str:
        """The token that marks where a reference's embedding goes (added to the vocabulary on first use)."""


@runtime_checkable
class Closable(Protocol):
    """A backend that holds a process or an engine to stop (in-process vLLM)."""

    def close(self) -> None: ...


def cut_at_stop(text: str, stop: list[str]) -> str:
    """Text up to the first stop string (excluded), as OpenAI-style APIs return it."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=len(text))
    return text[:cut]
