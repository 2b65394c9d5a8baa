"""Deterministic stand-ins for the LLM and the embedder, for unit tests."""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import requests
import urllib3
from requests.structures import CaseInsensitiveDict

from evaluation.kg_fixture.app import answer, read_body
from evaluation.kg_fixture.graph import KnowledgeGraph
from models.config import REPO_ROOT
from models.kg.client import ENDPOINTS, KGClient
from models.llm.backend import FAILED, LENGTH, STOP, Conversation, GenParams, Sample, cut_at_stop
from models.prompting import PROMPT_DIR, Messages
from utils.bag_embedder import BagOfWordsEmbedder

SEED_REPLY = "Thinking.\n===START===\n## Answer: paris\n## False Premise: no\n===END==="


def prompt_name(conversation: Conversation) -> str:
    """The name of the prompt file the conversation was rendered from, as the renderer tagged it (models.prompting
    Messages); "unrendered" for a conversation built by hand (the judge's)."""
    return (conversation.prompt or "unrendered") if isinstance(conversation, Messages) else "unrendered"


Reply = str | Sample | None


def by_prompt(**replies: Callable[[Conversation], Reply] | Reply) -> Callable[[Conversation], Reply]:
    """A reply function that answers each prompt (by name) with its own reply (a string or a function), and the
    others with SEED_REPLY. A name that is no prompt file is refused, so a misspelt key cannot pass unnoticed."""
    unknown = set(replies) - {path.stem for path in PROMPT_DIR.glob("*.yaml")}
    if unknown:
        raise ValueError(f"by_prompt: no prompt named {sorted(unknown)} in {PROMPT_DIR}")

    def reply(conversation: Conversation) -> Reply:
        chosen = replies.get(prompt_name(conversation), SEED_REPLY)
        return chosen(conversation) if callable(chosen) else chosen

    return reply


_TOKEN = re.compile(r"\s*\S+")


class ScriptedLLM:
    """A backend whose model's whole reply to a conversation is `reply(conversation)` (asked once per sample), and
    which generates it as models/llm/hf.py does (HFBackend._generate, _generate_batch); records every call.

    One of its tokens is a run of non-space characters with the spaces before it (a reply given as a Sample with
    `tokens` is generated as those tokens). Generation stops after `params.max_tokens` tokens; where a string of
    `params.stop` is in what was generated, the text is cut before it and the finish reason is STOP, else a reply
    longer than max_tokens ends with LENGTH, else with the reply's own finish reason (STOP for a str); the text
    is stripped. Past `params.deadline` no conversation is served ([] each), as hf starts no micro-batch then.
    Log-probabilities only where a scripted Sample carries them, cut with its tokens: like a server that gives
    none. A reply of None serves that conversation nothing."""

    def __init__(self, reply: Callable[[Conversation], Reply] = lambda c: SEED_REPLY) -> None:
        self.reply = reply
        self.calls: list[tuple[list[Conversation], GenParams]] = []

    def generate(self, conversations: Sequence[Conversation], params: GenParams) -> list[list[Sample]]:
        self.calls.append((list(conversations), params))
        if params.deadline is not None and params.deadline.expired():
            return [[] for _ in conversations]
        outputs = []
        for conversation in conversations:
            replies = [self.reply(conversation) for _ in range(params.n)]
            outputs.append([] if replies[0] is None else [generated(r, params) for r in replies if r is not None])
        return outputs


def generated(reply: str | Sample, params: GenParams) -> Sample:
    """`reply` as the fake generates it under `params` (ScriptedLLM); a failed Sample (Sample.failed) is served as
    it is, as the openai backend serves a request that got no reply."""
    scripted = reply if isinstance(reply, Sample) else Sample(reply)
    if scripted.finish_reason == FAILED:
        return scripted
    tokens = list(scripted.tokens) or _TOKEN.findall(scripted.text)
    kept = tokens[:params.max_tokens]
    text = "".join(kept) if len(kept) < len(tokens) or scripted.tokens else scripted.text
    reason = LENGTH if len(kept) < len(tokens) else scripted.finish_reason
    if any(stop and stop in text for stop in params.stop):
        text, reason = cut_at_stop(text, params.stop), STOP
    logprobs = scripted.token_logprobs[:len(kept)] if scripted.tokens else ()
    return Sample(text.strip(), reason, scripted.top_logprobs[:len(kept)], tuple(kept) if scripted.tokens else (),
                  tuple(logprobs))


HashEmbedder = BagOfWordsEmbedder  # bag of words hashed into 512 dimensions: texts sharing words are close


class RecordingKG(KGClient):
    """The KG client (models/kg/client.py KGClient) with only its HTTP send (`KGClient._send`) replaced: each request is
    answered in this process as evaluation/kg_fixture's route answers it (`read_body`, then `answer`), and the reply
    goes through the client's own reading, result type check, cache and counters.

    A body that does not fit the endpoint's request model answers HTTP 422. An endpoint in `answers` answers its
    value, or its function of the body's fields (a function that raises is HTTP 500, as a raising endpoint of
    theirs). Every other endpoint answers what the organisers' mock API (facebookresearch/CRAG mock_api/server.py,
    mock_api/cragapi/{open,movie,finance,music,sports}.py) answers for a name it does not hold, from
    evaluation/kg_fixture's KnowledgeGraph holding nothing: [] for the name searches, the Grammy by-year lists (years
    1957-2019) and award years; 0 for the Grammy counts; [null, null] for a lifespan and a Billboard rank; HTTP 500
    for an Oscar year outside 1990-2021; null elsewhere.

    `sent`: every request, (endpoint name, JSON body), in arrival order. The kg stage makes the calls of a batch's
    queries from `kg.concurrency` threads, as against the real server, so their order across queries is not fixed.
    """

    def __init__(self, answers: dict[str, object]) -> None:
        super().__init__("http://unused.invalid")
        self.answers = answers
        self.sent: list[tuple[str, dict]] = []
        self._paths = {endpoint.path: endpoint.name for endpoint in ENDPOINTS.values()}
        self._nothing = KnowledgeGraph(None).functions()
        self._serving = threading.Lock()  # theirs runs one endpoint function at a time, on its event loop

    @classmethod
    def over_fixtures(cls) -> RecordingKG:
        """Every endpoint answered from the fixture KG (evaluation/kg_fixture's KnowledgeGraph over data/kg), as the
        fixture server answers it."""
        graph = KnowledgeGraph(REPO_ROOT / "data" / "kg").functions()
        return cls({name: lambda fields, function=function: function(**fields) for name, function in graph.items()})

    def _send(self, url: str, body: dict[str, Any], timeout: tuple[float, float]) -> requests.Response:
        name = self._paths[url.removeprefix(self.base_url)]
        raw = json.dumps(body).encode()
        with self._serving:
            self.sent.append((name, json.loads(raw)))
            values, problem = read_body(name, raw)
            if problem is not None:
                status, content = 422, {"detail": problem}
            elif name in self.answers:
                held = self.answers[name]
                status, content = answer(lambda **fields: held(fields) if callable(held) else held, name, values)
            else:
                status, content = answer(self._nothing[name], name, values)
        payload, media = b"Internal Server Error", "text/plain"
        if status != 500:
            try:  # rendered as FastAPI's JSONResponse renders it: what it cannot render is HTTP 500
                payload = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
                media = "application/json"
            except (TypeError, ValueError):
                status = 500
        reply = requests.Response()
        reply.status_code, reply.url = status, url
        reply.headers = CaseInsensitiveDict({"Content-Type": media, "Content-Length": str(len(payload))})
        reply.raw = urllib3.HTTPResponse(body=io.BytesIO(payload), headers=dict(reply.headers), status=status,
                                         preload_content=False)
        return reply


def texts(outputs: list[list[Sample]]) -> list[list[str]]:
    """The texts of a backend's samples, conversation by conversation."""
    return [[sample.text for sample in samples] for samples in outputs]
