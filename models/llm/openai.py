"""Any OpenAI-compatible chat server: vllm serve, transformers serve, or a hosted API."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2 as httpx  # the HTTP client of openai 3 (its fork of httpx)
import openai
import tenacity
from loguru import logger

from models.config import OpenAIConfig
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
from models.llm.profile import ModelProfile
from utils.errors import one_line
from utils.retry import backoff
from utils.time_budget import Deadline
from utils.token_cut import kept_spans

# Worth another try: the server may come back or the limit may lift. Anything else (a bad request,
# a wrong key, an unknown model) fails the same way again, so it is logged once and not retried.
_TRANSIENT = (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)


class NoReply(RuntimeError):
    """A request that gave no samples, and why (logged once per generate call, with the others)."""


def _short(err: Exception) -> str:
    return one_line(err)


class ReplyRefused(RuntimeError):
    """A reply that cannot be used: over the size cap, unreadable, or still arriving at the deadline."""


class ReplyLate(ReplyRefused):
    """A reply still arriving (or just finished) when the request's time ran out."""


class CutByDeadline(RuntimeError):
    """A request the batch deadline ended before its reply came: the in-process engines' DEADLINE, with no text
    (a chat completion arrives whole). Not a failed call: the budget did what it is for, and a resume would
    meet the same deadline."""


class PromptLimit:
    """The openai backend's prompt cut (the profile's prompt_tokens, counted with the profile's tokenizer and chat
    template): an over-long conversation's longest message keeps its head quarter and tail, as the hf backend cuts
    its prompt ids (utils/token_cut.py). The server then never refuses a prompt the hf backend would have read."""

    ROUNDS = 3  # a cut text can tokenize a few tokens longer than its pieces: cut again, at most this often

    def __init__(self, profile: ModelProfile) -> None:
        from models.llm.profile import load_tokenizer

        folder = None if profile.tokenizer else tokenizer_folder(profile)
        self.tokenizer: Any = load_tokenizer(folder, profile)
        self.limit = profile.prompt_tokens

    def length(self, conversation: Conversation) -> int:
        return len(self.tokenizer.apply_chat_template(list(conversation), add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)["input_ids"])

    def fit(self, conversation: Conversation) -> Conversation:
        length = first = self.length(conversation)
        rounds = 0
        while length > self.limit and rounds < self.ROUNDS:
            longest = max(range(len(conversation)), key=lambda i: len(conversation[i]["content"]))
            ids = self.tokenizer(conversation[longest]["content"], add_special_tokens=False)["input_ids"]
            keep = len(ids) - (length - self.limit)
            if keep < 1:  # the other messages alone are over the limit: nothing here can cut it
                break
            text = "".join(self.tokenizer.decode(ids[span]) for span in kept_spans(len(ids), keep))
            conversation = [*conversation[:longest], {**conversation[longest], "content": text},
                            *conversation[longest + 1:]]
            length, rounds = self.length(conversation), rounds + 1
        if length != first:
            logger.warning("prompt of {} tokens cut to {}", first, length)
        return conversation


def tokenizer_folder(profile: ModelProfile):
    """The folder of the profile's weights on this machine, for their tokenizer; BackendUnavailable naming the fix
    where the weights are on the server's machine only."""
    from models.llm.hf import resolve_model_folder

    try:
        return resolve_model_folder(profile)
    except BackendUnavailable as err:
        raise BackendUnavailable(f"{err}: the openai backend counts prompt tokens with the profile's tokenizer; copy "
                                 "the folder's tokenizer files here and name them in the profile's tokenizer:") \
            from None


class OpenAIBackend:
    def __init__(self, config: OpenAIConfig, profile: ModelProfile) -> None:
        self.config = config
        self.model = profile.name
        self.prompt_limit = PromptLimit(profile) if profile.weights or profile.tokenizer else None
        self.client = openai.OpenAI(base_url=config.base_url, api_key=os.environ.get(config.api_key_env) or "EMPTY",
                                    max_retries=0, timeout=config.request_timeout_s)
        self.logprobs_refused = False  # the server answered a request for log-probabilities with HTTP 400
        self.n_ignored = False  # the server answered a request for n samples with fewer (said once)
        self.logprobs_ignored = False  # the server answered a request for log-probabilities without them (said once)
        logger.info("openai backend: model {} at {}", self.model, config.base_url)

    def probe(self) -> None:
        """One request of one token, before any work: a wrong API key, model name or URL raises BackendUnavailable
        with one line naming what to fix, instead of every later answer turning into "i don't know"."""
        where = f"{self.config.base_url} (model {self.model!r})"
        try:
            self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "OK?"}],
                                                max_tokens=1, timeout=self.config.request_timeout_s)
        except openai.AuthenticationError as err:
            raise BackendUnavailable(f"{where} refused the API key (HTTP {err.status_code}): set "
                                     f"${self.config.api_key_env}") from None
        except openai.APIStatusError as err:
            raise BackendUnavailable(f"{where} answered HTTP {err.status_code} "
                                     f"({' '.join(str(err.message).split())[:120]}): check the URL and the model "
                                     "name") from None
        except openai.APIConnectionError as err:
            raise BackendUnavailable(f"{where}: no server answers ({type(err).__name__}): start it or fix the "
                                     "URL (local_evaluation.py --serve-llm serves the embedded model)") from None

    def generate(self, conversations: Sequence[Conversation], params: GenParams) -> list[list[Sample]]:
        if self.prompt_limit is not None:
            conversations = [self.prompt_limit.fit(c) for c in conversations]
        per_request = params.n if self.config.native_n else 1
        jobs = [(i, per_request) for i in range(len(conversations)) for _ in range(params.n // per_request)]
        def send(job: tuple[int, int]) -> tuple[list[Sample], str | None, str | None]:
            """The job's samples, why it got none, and why the deadline cut it."""
            try:
                return self._request(conversations[job[0]], params, job[1]), None, None
            except CutByDeadline as err:
                return [Sample("", DEADLINE)] * job[1], None, str(err)
            except NoReply as err:
                return [], str(err), None

        with ThreadPoolExecutor(max_workers=max(1, self.config.concurrency)) as pool:
            replies = list(pool.map(send, jobs))
        outputs: list[list[Sample]] = [[] for _ in conversations]
        for (index, _), (texts, problem, _) in zip(jobs, replies):
            outputs[index].extend(texts if problem is None else [Sample.failed(problem)])
        cut = Counter(why for _, _, why in replies if why)
        if cut:  # the budget at work, not a fault: said once per call
            logger.warning("{}: {} of {} requests cut by the batch deadline: {}", self.config.base_url,
                           sum(cut.values()), len(jobs), "; ".join(f"{why} (x{n})" for why, n in cut.most_common()))
        problems = Counter(problem for _, problem, _ in replies if problem)
        if problems:  # once per call, however many requests failed, with each cause and its count
            logger.error("{}: {} of {} requests got no reply: {}", self.config.base_url, sum(problems.values()),
                         len(jobs), "; ".join(f"{cause} (x{count})" for cause, count in problems.most_common()))
        return outputs

    def _request(self, messages: Conversation, params: GenParams, n: int) -> list[Sample]:
        """The samples of one request, retried on transient errors while the deadline allows; NoReply saying
        why when there are none, CutByDeadline when the batch deadline ended it."""
        retries = backoff(self.config.max_retries + 1, self.config.backoff_s, _TRANSIENT,
                          lambda wait: self._timeout(params.deadline) > wait, after=self._failed)
        try:
            for attempt in retries:
                with attempt:
                    return self._attempt(messages, params, n)
        except _TRANSIENT as err:
            raise NoReply(f"{type(err).__name__}: {_short(err)} after {retries.statistics['attempt_number']} "
                          "attempts") from None
        raise NoReply("no attempt made")

    def _failed(self, state: tenacity.RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome else None
        logger.debug("request to {} failed ({}: {}), attempt {}/{}", self.config.base_url, type(err).__name__, err,
                     state.attempt_number, self.config.max_retries + 1)

    def _attempt(self, messages: Conversation, params: GenParams, n: int) -> list[Sample]:
        """One request: its samples, a transient error to retry, NoReply, or CutByDeadline where the batch
        deadline (not `llm.openai.request_timeout_s`) set the time the reply did not come in."""
        timeout = self._timeout(params.deadline)
        if timeout <= 0:
            raise CutByDeadline("no time left to send the request")
        by_deadline = timeout < self.config.request_timeout_s
        # Servers that offer log-probabilities (vLLM, OpenAI) return them; transformers serve ignores the
        # fields; a server that refuses them (HTTP 400 or 422 naming them) is asked again without, and never again
        # with them.
        logprobs = ({"logprobs": True, **({"top_logprobs": params.top_logprobs} if params.top_logprobs else {})}
                    if (params.logprobs or params.top_logprobs) and not self.logprobs_refused else {})
        try:
            reply = self._post(timeout, model=self.model, messages=messages, max_tokens=params.max_tokens,
                               temperature=params.temperature, n=n, stop=params.stop or None, seed=params.seed,
                               **logprobs)
        except (openai.BadRequestError, openai.UnprocessableEntityError) as err:
            if not logprobs or "logprob" not in str(err).lower():
                raise NoReply(f"refused ({type(err).__name__}: {_short(err)})") from None
            logger.warning("{} refused log-probabilities ({}); asking without them from now on",
                           self.config.base_url, _short(err))
            self.logprobs_refused = True
            return self._request(messages, params, n)
        except openai.APITimeoutError:
            if by_deadline:
                raise CutByDeadline("no reply came before it") from None
            raise
        except _TRANSIENT:
            raise
        except ReplyLate as err:
            if by_deadline:
                raise CutByDeadline("the reply was still arriving") from None
            raise NoReply(f"reply not used: {err}") from None
        except openai.APIError as err:
            raise NoReply(f"refused ({type(err).__name__}: {_short(err)})") from None
        except ReplyRefused as err:
            raise NoReply(f"reply not used: {err}") from None
        if len(reply) < n and not self.n_ignored:  # transformers serve ignores n
            self.n_ignored = True
            logger.warning("{} returned {} of {} samples for one request: it ignores n; set "
                           "llm.openai.native_n: false", self.config.base_url, len(reply), n)
        if logprobs and reply and not any(choice["tokens"] for choice in reply) and not self.logprobs_ignored:
            self.logprobs_ignored = True  # transformers serve ignores the fields
            logger.warning("{} gives no log-probabilities: the samples carry none", self.config.base_url)
        return [Sample(cut_at_stop(choice["text"], params.stop).strip(), choice["finish_reason"],
                       choice["top_logprobs"], choice["tokens"], choice["token_logprobs"]) for choice in reply]

    def _post(self, seconds: float, **request) -> list[dict]:
        """The choices of one chat completion ({"text", "finish_reason", "top_logprobs"}), the request bounded as
        a whole: the client's timeout bounds each read only, so a server that trickles its reply could hold it
        for ever; here a watchdog closes the response after `seconds`, and a reply over `max_reply_bytes` is
        dropped as it arrives. ReplyRefused for either, and for a body that is not a chat completion."""
        ends = time.monotonic() + seconds
        with self.client.chat.completions.with_streaming_response.create(**request, timeout=seconds) as response:
            watchdog = threading.Timer(max(0.0, ends - time.monotonic()), response.close)
            watchdog.start()
            body = bytearray()
            try:
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > self.config.max_reply_bytes:
                        raise ReplyRefused(f"over {self.config.max_reply_bytes} bytes (llm.openai.max_reply_bytes)")
            except (httpx.HTTPError, httpx.StreamError) as err:
                if time.monotonic() < ends:  # the connection broke: worth another try
                    raise openai.APIConnectionError(message=f"reply cut off: {err}",
                                                    request=response.http_request) from err
                raise ReplyLate(f"still arriving after {seconds:.1f} s (the batch deadline or "
                                f"llm.openai.request_timeout_s); {len(body)} bytes read") from None
            finally:
                watchdog.cancel()
        if time.monotonic() >= ends:  # the last bytes came as the watchdog fired
            raise ReplyLate(f"finished after {seconds:.1f} s, past the deadline")
        return read_choices(bytes(body))
    def _timeout(self, deadline: Deadline | None) -> float:
        if deadline is None:
            return self.config.request_timeout_s
        return min(self.config.request_timeout_s, deadline.remaining())


def read_choices(body: bytes) -> list[dict]:
    """The choices of a chat completion body, each {"text", "finish_reason" (STOP or LENGTH), "top_logprobs",
    "tokens", "token_logprobs"};
    ReplyRefused for a body that is not JSON or has no list of choices. A choice without a message reads as
    empty text (the stages treat it as no answer)."""
    try:
        data = json.loads(body)
    except ValueError:
        raise ReplyRefused(f"not JSON ({len(body)} bytes: {body[:60]!r})") from None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise ReplyRefused(f"no list of choices in the reply ({len(body)} bytes: {body[:60]!r})")
    choices = []
    for choice in data["choices"]:
        choice = choice if isinstance(choice, dict) else {}
        message = choice.get("message")
        message = message if isinstance(message, dict) else {}
        content = message.get("content")
        choices.append({"text": content if isinstance(content, str) else "",
                        "finish_reason": LENGTH if choice.get("finish_reason") == "length" else STOP,
                        "top_logprobs": top_logprobs(choice.get("logprobs")),
                        **dict(zip(("tokens", "token_logprobs"), chosen(choice.get("logprobs"))))})
    return choices


def top_logprobs(logprobs: object) -> TopLogprobs:
    """A choice's `logprobs.content` (per token: token, logprob, top_logprobs) as token text -> log-probability
    for each generated token; empty where the server sent none (or something else)."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return ()
    return tuple({alt["token"]: float(alt["logprob"]) for alt in token.get("top_logprobs") or []
                  if isinstance(alt, dict) and isinstance(alt.get("token"), str)
                  and isinstance(alt.get("logprob"), (int, float))}
                 for token in content if isinstance(token, dict))


def chosen(logprobs: object) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """A choice's generated tokens (`logprobs.content[i].token`) and their own log-probabilities
    (`.logprob`); empty where the server sent none, or any entry is malformed."""
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not all(isinstance(t, dict) and isinstance(t.get("token"), str)
                                                and isinstance(t.get("logprob"), (int, float)) for t in content):
        return (), ()
    return tuple(t["token"] for t in content), tuple(float(t["logprob"]) for t in content)
