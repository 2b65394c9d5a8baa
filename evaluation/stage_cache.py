"""The query states after a prefix of a pipeline, cached by what they depend on, so that a command that varies a
later stage (tools/tune_prompts.py, `local_evaluation.py ablate`) runs the stages before it once.

A prefix's key holds the question and its pages, the stage names, the digests of the prompts those stages render,
and the settings they can read: every config section no stage declares (the LLM, the embedder, the budget, the
task, ...), the sections the prefix's stages declare, and those of the resources they need (`Resource.sections`).
A section only a later stage reads (`knowledge`, when the knowledge extractor comes after the prefix) is left out,
so switching that stage on or off answers from the same entry. The states keep their embeddings: R2AG and the
multi-hop strategies read them after the references stage.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from models.config import SystemConfig
from models.prompting import PromptLibrary
from models.resources import RESOURCES, build_order
from models.stages import STAGES, Stage
from models.state import ADDED_FIELDS, QueryState, Reference, StageRecord
from utils.cache import content_key

STAGE_CACHE_VERSION = "stages-5"
VECTORS = ("query_vector", "reference_vectors", "candidate_vectors")
# Keys that never change what a stage computes: where files go, what is recorded; the stage names and the prompts'
# digests stand in for the strategy and the prompt files.
UNREAD = ("source", "prompts", "strategy", "strategies", "record_prompts", "stage_modules")


def _array(value: np.ndarray | None) -> dict[str, Any] | None:
    if value is None:
        return None
    value = np.ascontiguousarray(value)
    return {"dtype": str(value.dtype), "shape": list(value.shape), "data": base64.b64encode(value.tobytes()).decode()}


def _unarray(value: dict[str, Any] | None) -> np.ndarray | None:
    if value is None:
        return None
    flat = np.frombuffer(base64.b64decode(value["data"]), dtype=np.dtype(value["dtype"]))
    return flat.reshape(value["shape"]).copy()


def state_to_json(state: QueryState) -> dict[str, Any]:
    """A state as JSON, its embeddings exact (base64 of their bytes); not its pages, which the data file gives back
    (state_from_json)."""
    bare = dataclasses.replace(state, pages=[], query_vector=None, reference_vectors=None, candidate_vectors=None)
    data = dataclasses.asdict(bare)
    data.pop("pages")
    data.update({name: _array(getattr(state, name)) for name in VECTORS})
    return data


def state_from_json(data: dict[str, Any], pages: list[dict[str, Any]]) -> QueryState:
    """A state of its own: nothing it holds is `data`'s, which the cache hands out again from memory, so the
    stages it goes through change neither that entry nor a record made of a state read from it before."""
    data = copy.deepcopy(data)
    fields = dict(data, pages=pages)
    fields["references"] = [Reference(**r) for r in data["references"]]
    fields["candidates"] = [Reference(**r) for r in data.get("candidates", [])]
    fields["added"] = {name: load(value) if (load := ADDED_FIELDS[name][1].load) else value
                       for name, value in data.get("added", {}).items() if name in ADDED_FIELDS}
    fields["trace"] = [StageRecord(**r) for r in data["trace"]]
    for name in VECTORS:
        fields[name] = _unarray(data.get(name))
    return QueryState(**fields)


def declared_sections() -> frozenset[str]:
    """The config sections some registered stage declares: read only where that stage runs."""
    return frozenset(section for name in STAGES for section in STAGES.get(name).sections)


def read_sections(stages: Iterable[type[Stage] | Stage]) -> set[str]:
    """The stage-declared sections `stages` can read: their own and those of the resources they need."""
    stages = list(stages)
    sections = {section for stage in stages for section in stage.sections}
    for name in build_order({need for stage in stages for need in stage.needs}):
        declared = RESOURCES[name][1].sections
        sections |= declared_sections() if declared is None else set(declared)
    return sections


def prefix_signature(config: SystemConfig, prompts: PromptLibrary, stages: Sequence[type[Stage] | Stage]) -> str:
    """What the states after `stages` (a pipeline's first stages, in order) depend on, the questions aside."""
    settings = config.resolved()
    unread = (declared_sections() - read_sections(stages)) | set(UNREAD)
    kept = {key: value for key, value in settings.items() if key not in unread}
    digests = [prompts.get(name).digest for stage in stages for name in stage.prompts]
    return content_key(STAGE_CACHE_VERSION, json.dumps(kept, sort_keys=True, default=str),
                       *[stage.name for stage in stages], *digests)


def example_key(signature: str, example: dict[str, Any]) -> str:
    """The cache key of one question's state after the prefix of `signature`."""
    return content_key(signature, example["interaction_id"], example["query"], example["query_time"],
                       json.dumps(example["search_results"], sort_keys=True))


def pages_of(example: dict[str, Any]) -> list[dict[str, Any]]:
    return [page for page in example["search_results"] if isinstance(page, dict)]
