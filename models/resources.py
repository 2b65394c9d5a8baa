"""What stages may need, built once by CragSystem: a registry of resources by name, each with its builder and the
resources it is built from. A stage names its resources in `needs`; a stage that brings a new one declares it in
`Stage.resources`, which registers it here.

The shared resources are registered here: the page workers, the LLM backend, the sentence embedder and the
cross-encoder; the others by the stages that bring them. They are built in the order they are registered, a
resource after those it depends on, those marked `first` before all: a check of the config that loads no model.
The pages come next, so their workers fork before any model loads and copy no model or GPU state.
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
    pipeline (the KG client)."""

    build: Builder
    depends: tuple[str, ...] = ()
    doc: str = ""
    first: bool = False
    drops: bool = False


RESOURCES: dict[str, tuple[str, Resource]] = {}  # name -> (declaring module, resource), in build order


def add_resource(name: str, resource: Resource, owner: str) -> None:
    """Register `resource` as `name` (declared by `owner`, a module); its dependencies must be registered first."""
    taken = RESOURCES.get(name)
    if taken is not None and taken[0] != owner:
        raise RegistryError(f"{owner}: resource {name!r} is already declared by {taken[0]}")
    if unknown := [d for d in resource.depends if d not in RESOURCES]:
        raise RegistryError(f"{owner}: resource {name!r} depends on unknown resources {unknown}; known: "
                            f"{', '.join(RESOURCES)}")
    RESOURCES[name] = (owner, resource)


def build_order(needed: Iterable[str]) -> list[str]:
    """`needed` and what they depend on, in registration order (dependencies are registered first)."""
    wanted, stack = set(), list(needed)
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            stack.extend(RESOURCES[name][1].depends)
    return sorted((name for name in RESOURCES if name in wanted), key=lambda name: not RESOURCES[name][1].first)


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
    "pages": Resource(_pages, doc="the page workers and their cache"),
    "llm": Resource(_llm, doc="the LLM backend of `llm.backend`"),
    "embedder": Resource(_embedder, doc="the sentence embedder"),
    "reranker": Resource(_reranker, doc="the cross-encoder of `references.rerank` (None without a model)"),
}.items():
    add_resource(_name, _resource, __name__)
