"""Deterministic stand-ins for the LLM and the embedder, for unit tests."""

from __future__ import annotations

from collections.abc import Callable

from models.llm.base import Conversation, GenParams
from models.prompting import PROMPT_DIR
from utils.bag_embedder import BagOfWordsEmbedder
from utils.kg_api import KGClient


SEED_REPLY = "Thinking.\n===START===\n## Answer: paris\n## False Premise: no\n===END==="


def prompt_name(conversation: Conversation) -> str:
    """The name of the prompt file the conversation was rendered from, as the renderer tagged it (models.prompting
    Messages); "unrendered" for a conversation built by hand."""
    return getattr(conversation, "prompt", "unrendered")


def by_prompt(**replies: Callable[[Conversation], str | None] | str | None) -> Callable[[Conversation], str | None]:
    """A reply function that answers each prompt (by name) with its own reply (a string or a function), and the
    others with SEED_REPLY. A name that is no prompt file is refused, so a misspelt key cannot pass unnoticed."""
    unknown = set(replies) - {path.stem for path in PROMPT_DIR.glob("*.yaml")}
    if unknown:
        raise ValueError(f"by_prompt: no prompt named {sorted(unknown)} in {PROMPT_DIR}")

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
