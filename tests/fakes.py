"""Deterministic stand-ins for the LLM and the embedder, for unit tests."""

from __future__ import annotations

from collections.abc import Callable

from models.llm.base import Conversation, GenParams
from utils.bag_embedder import BagOfWordsEmbedder
from utils.kg_api import KGClient


SEED_REPLY = "Thinking.\n===START===\n## Answer: paris\n## False Premise: no\n===END==="
# How each prompt's system message starts, so that one scripted LLM can answer every stage differently.
PROMPT_MARKERS = {
    "reasoning": "You are an expert at answering questions from references",
    "knowledge": "You answer questions from your own knowledge",
    "calculator": "You write arithmetic",
    "summariser": "Answer the question in as few words",
    "attributes": "Classify questions",
    "kg_entities": "You extract entities for knowledge-graph lookups",
    "kg_functions": "You choose knowledge-graph API calls",
    "hanrag_router": "You route questions",
    "hanrag_relevance": "You judge whether a reference helps",
    "hanrag_decompose": "You split a question into independent sub-questions",
    "hanrag_refine": "You plan a chain of lookups",
    "hanrag_check": "You decide whether the facts are enough",
    "hanrag_aggregate": "You answer a question from facts found",
    "dualrag_reason": "You reason step by step towards the answer",
    "dualrag_entities": "You name the entities whose facts must be looked up",
    "dualrag_summarise": "You write short notes about one entity",
    "dualrag_answer": "You answer a question from gathered knowledge",
    "pgcc": "You are an expert at answering questions from retrieved evidence",
    "propositions": "You split a passage into propositions",
}


def prompt_name(conversation: Conversation) -> str:
    system = conversation[0]["content"] if conversation and conversation[0]["role"] == "system" else ""
    return next((name for name, marker in PROMPT_MARKERS.items() if system.startswith(marker)), "unknown")


def by_prompt(**replies: Callable[[Conversation], str | None] | str | None) -> Callable[[Conversation], str | None]:
    """A reply function that answers each prompt (by name) with its own reply (a string or a function)."""

    def reply(conversation: Conversation) -> str | None:
        chosen = replies.get(prompt_name(conversation), SEED_REPLY)
        return chosen(conversation) if callable(chosen) else chosen

    return reply


class ScriptedLLM:
    """Answers each conversation with `reply(conversation)` (once per sample); records every call."""

    def __init__(self, reply: Callable[[Conversation], str | None] = lambda c: SEED_REPLY) -> None:
        self.reply = reply
        self.calls: list[tuple[list[Conversation], GenParams]] = []

    def generate(self, conversations: list[Conversation], params: GenParams) -> list[list[str]]:
        self.calls.append((conversations, params))
        outputs = []
        for conversation in conversations:  # reply is asked once per sample; None serves the conversation nothing
            samples = [self.reply(conversation) for _ in range(params.n)]
            outputs.append([] if samples[0] is None else [s for s in samples if s is not None])
        return outputs


HashEmbedder = BagOfWordsEmbedder  # bag of words hashed into 512 dimensions: texts sharing words are close


class RecordingKG(KGClient):
    """A client whose server is a dict of endpoint name -> result (or function of the request body): records
    every call that would have been sent. Exact like the real server: a name it does not hold answers None."""

    def __init__(self, answers: dict[str, object]) -> None:
        super().__init__("http://unused.invalid")
        self.answers = answers
        self.sent: list[tuple[str, dict]] = []

    def _post(self, endpoint, body, deadline):
        self.sent.append((endpoint.name, body))
        answer = self.answers.get(endpoint.name)
        return True, answer(body) if callable(answer) else answer
