"""Training inputs from CRAG examples: each question's state after the references stage (what R2AG, the hash
layer and the quantizer's calibration texts learn from), and the answer block the reasoning prompt asks for."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from tqdm import tqdm

from models.config import SystemConfig
from models.prompting import Messages, PromptLibrary
from models.retrieval.embedder import Embedder
from models.stages.hash_retriever import HashKeys, build_hash_model, hash_settings
from models.stages.reasoning import END, START, reasoning_conversation
from models.stages.references import ReferencesStage
from models.stages.stage import run_alone
from models.state import QueryState
from utils.answers import is_invalid
from utils.web_pages import PageProcessor, PageSettings


def answer_block(answer: str) -> str:
    """The reasoning prompt's output format around a gold answer: the LM loss's target."""
    premise = "yes" if is_invalid(answer) else "no"
    return f"{START}\n## Answer: {answer}\n## False Premise: {premise}\n{END}"


def reference_states(examples: list[dict], config: SystemConfig, embedder: Embedder
                     ) -> Iterator[tuple[QueryState, dict]]:
    """(state after the references stage of `config`, its example) for each CRAG example, batch by batch.
    There is no LLM here: a hash retriever splits chunks into sentences even with `hash.units: llm`."""
    config = config.with_keys("references", HashKeys, hash=dataclasses.replace(hash_settings(config), units="sentence"))
    pages = PageProcessor(PageSettings.from_config(config.references), config.references.workers, None)
    hash_model = build_hash_model(config, PromptLibrary(config.prompts), {"embedder": embedder})
    resources = {"embedder": embedder, "pages": pages, "hash_model": hash_model, "reranker": None, "llm": None}
    try:
        for start in tqdm(range(0, len(examples), config.batch_size), desc="references", unit="batch"):
            chunk = examples[start:start + config.batch_size]
            states = [QueryState(i, e["interaction_id"], e["query"], e["query_time"],
                                 [p for p in e["search_results"] if isinstance(p, dict)]) for i, e in enumerate(chunk)]
            run_alone(ReferencesStage(), states, config, resources, seconds=10 ** 9)
            yield from zip(states, chunk)
    finally:
        pages.close()


def reasoning_conversations(examples: list[dict], config: SystemConfig) -> Iterator[tuple[Messages, dict]]:
    """(the reasoning prompt over the example's references, as the reasoning stage of `config` builds it; the
    example) for each CRAG example. No LLM runs."""
    prompt = PromptLibrary(config.prompts).get("reasoning")
    for state, example in reference_states(examples, config, Embedder(config.embedder)):
        yield reasoning_conversation(prompt, state, config.reasoning.max_reference_chars), example
