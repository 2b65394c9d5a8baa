"""What stages may need, built once by CragSystem: a registry of resources by name, each with its builder and the
resources it is built from. A stage names its resources in `needs`; a stage that brings a new one declares it in
`Stage.resources`, which registers it here.

The shared resources are registered here: the page workers, the LLM backend, the sentence embedder and the
cross-encoder; the others by the stages that bring them, in any order: a resource may depend on one a later module
registers. They are built after what they depend on, else in the order they are registered, those marked `first`
before all (a check of the config that loads no model). The pages come next, so their workers fork before any
model loads and copy no model or GPU state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from models.config import SystemConfig
from models.llm.backend import LLM, Probed
from models.llm.backends import create_llm
from models.prompting import PromptLibrary
from models.registry import RegistryError
from models.retrieval.embedder import Embedder
from models.retrieval.reranker import Reranker
from utils.cache import cache_root
from utils.web_pages import PageProcessor, PageSettings

Builder = Callable[[SystemConfig, PromptLibrary, dict[str, Any]], Any]


@dataclass(frozen=True)
class Resource:
    """A resource: `build(config, prompts, built)` makes it from the config and the resources already built (those in
    `depends` among them); it may return None where the config leaves it out. `first`: built before every other
    (it loads no model). `drops`: None means a service did not answer, and the stages that need it leave the
    pipeline (the KG client). `sections`: the config sections its builder reads, so that two configs equal in
    those share one (`local_evaluation.py ablate`) and a cached stage's key holds them (evaluation/stage_cache.py);
    None where it reads the whole config."""

    build: Builder
    depends: tuple[str, ...] = ()
    doc: str = ""
    first: bool = False
    drops: bool = False
    sections: tuple[str, ...] | None = None


RESOURCES: dict[str, tuple[str, Resource]] = {}  # name -> (declaring module, resource), in build order


def add_resource(name: str, resource: Resource, owner: str) -> None:
    """Register `resource` as `name` (declared by `owner`, a module). What it depends on may be registered later:
    `build_order` checks it."""
    taken = RESOURCES.get(name)
    if taken is not None and taken[0] != owner:
        raise RegistryError(f"{owner}: resource {name!r} is already declared by {taken[0]}")
    RESOURCES[name] = (owner, resource)


def build_order(needed: Iterable[str]) -> list[str]:
    """`needed` and what they depend on, each after its dependencies, else those marked `first` first and the rest
    in registration order. A RegistryError names a dependency nothing registers, or a cycle."""
    wanted, stack = set(), list(needed)
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            for dependency in RESOURCES[name][1].depends:
                if dependency not in RESOURCES:
                    raise RegistryError(f"{RESOURCES[name][0]}: resource {name!r} depends on unknown resource "
                                        f"{dependency!r}; known: {', '.join(RESOURCES)}")
                stack.append(dependency)
    waiting = sorted((name for name in RESOURCES if name in wanted), key=lambda name: not RESOURCES[name][1].first)
    order: list[str] = []
    while waiting:
        ready = next((name for name in waiting if set(RESOURCES[name][1].depends) <= set(order)), None)
        if ready is None:
            raise RegistryError(f"resources depend on each other in a cycle: {', '.join(waiting)}")
        order.append(ready)
        waiting.remove(ready)
    return order


def build_resources(config: SystemConfig, prompts: PromptLibrary, needed: Iterable[str],
                    given: dict[str, Any]) -> dict[str, Any]:
    """The resources `needed` and those they depend on, in build order; a given one (not None) is used as is."""
    built: dict[str, Any] = {}
    for name in build_order(needed):
        built[name] = given[name] if given.get(name) is not None else RESOURCES[name][1].build(config, prompts, built)
    return built


def _pages(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> PageProcessor:
    refs = config.references
    return PageProcessor(PageSettings.from_config(refs), refs.workers,
                         cache_root(refs.cache_dir) / "pages" if refs.cache else None)


def _llm(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> LLM:
    llm = create_llm(config.llm)
    if isinstance(llm, Probed):  # a remote server: a wrong key, model or URL stops here
        llm.probe()
    return llm


def _embedder(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> Embedder:
    return Embedder(config.embedder)


def _reranker(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> Reranker | None:
    rerank = config.references.rerank
    return Reranker(rerank) if rerank.model else None


for _name, _resource in {
    "pages": Resource(_pages, doc="the page workers and their cache", sections=("references",)),
    "llm": Resource(_llm, doc="the LLM backend of `llm.backend`", sections=("llm",)),
    "embedder": Resource(_embedder, doc="the sentence embedder", sections=("embedder",)),
    "reranker": Resource(_reranker, doc="the cross-encoder of `references.rerank` (None without a model)",
                         sections=("references",)),
}.items():
    add_resource(_name, _resource, __name__)
