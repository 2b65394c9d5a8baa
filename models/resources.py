"""What stages may need, built once by CragSystem: a registry of resources by name, each with its builder and the
resources it is built from. A stage names its resources in `needs`; a stage that brings a new one declares it in
`Stage.resources`, which registers it here.

The built-in resources: the answer gate, the page workers, the LLM backend, the sentence embedder, the
cross-encoder, the KG client (tasks 2 and 3, when its server answered), the hash layer and the R2AG head. They are
built in the order they are registered, a resource after those it depends on: the gate first, so a gate the config
cannot feed stops the start before anything loads; then the pages, whose workers fork before any model loads and
so copy no model or GPU state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from loguru import logger

from models.config import SystemConfig, resolve_path
from models.gate.answer_gate import Gate, gate_for
from models.kg.client import KGClient
from models.llm.backend import LLM, Probed, TakesEmbeddings, create_llm
from models.prompting import PromptLibrary
from models.registry import RegistryError
from models.retrieval.embedder import Embedder
from models.retrieval.hash_index import HashModel, load_model
from models.retrieval.r2former_head import R2FormerError, R2FormerHead, load_checkpoint
from models.retrieval.reranker import Reranker
from utils.cache import cache_root
from utils.web_pages import PageProcessor, PageSettings

Builder = Callable[[SystemConfig, PromptLibrary, dict[str, Any]], Any]


@dataclass(frozen=True)
class Resource:
    """A resource: `build(config, prompts, built)` makes it from the config and the resources already built (those in
    `depends` among them); it may return None where the config leaves it out."""

    build: Builder
    depends: tuple[str, ...] = ()
    doc: str = ""


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
    return [name for name in RESOURCES if name in wanted]


def build_resources(config: SystemConfig, prompts: PromptLibrary, needed: Iterable[str],
                    given: dict[str, Any]) -> dict[str, Any]:
    """The resources `needed` and those they depend on, in build order; a given one (not None) is used as is."""
    built: dict[str, Any] = {}
    for name in build_order(needed):
        built[name] = given[name] if given.get(name) is not None else RESOURCES[name][1].build(config, prompts, built)
    return built


def _gate(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> Gate:
    return gate_for(config, prompts)


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


def _kg_client(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> KGClient | None:
    """A client whose server answered at start-up (one probe, logged), else None: the pipeline then has no kg stage,
    so no call of the run goes to a server that is not there."""
    client = KGClient.from_config(config.kg)
    return client if client.probe() else None


def _hash_model(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> HashModel | None:
    """The hash layer of `references.hash.model` (retriever hash only), checked against the embedder."""
    if config.references.retriever != "hash":
        return None
    return load_model(resolve_path(config.references.hash.model), embedder=getattr(built.get("embedder"), "name", ""))


def _r2former(config: SystemConfig, prompts: PromptLibrary, built: dict[str, Any]) -> R2FormerHead | None:
    """The R2AG head of the config (r2ag.enabled only). Prompt mode needs a backend that takes input embeddings and a
    checkpoint trained for this LLM's hidden size; a backend without embeddings falls back to relevance mode
    (logged)."""
    settings = config.r2ag
    if not settings.enabled:
        return None
    llm = built["llm"]
    prompting = settings.mode == "prompt"
    if prompting and not isinstance(llm, TakesEmbeddings):
        logger.warning("r2ag.mode prompt: the {} backend cannot take input embeddings; R2AG filters references "
                       "instead (relevance mode)", config.llm.backend)
        prompting = False
    path = resolve_path(settings.checkpoint)
    checkpoint = load_checkpoint(path, settings.device, llm.hidden_size if prompting else None)
    embedder = getattr(built["embedder"], "name", "")
    if checkpoint.embedder != embedder:
        raise R2FormerError(f"{path}: trained on {checkpoint.embedder} embeddings, but the embedder is {embedder}; "
                            "retrain it with this embedder (tools/train_r2former.py)")
    if prompting:
        llm.retrieval_placeholder()  # the token joins the vocabulary now, not inside a batch
    return R2FormerHead(checkpoint, settings.device, prompting)


for _name, _resource in {
    "gate": Resource(_gate, doc="the answer gate of `answer.gate`"),
    "pages": Resource(_pages, doc="the page workers and their cache"),
    "llm": Resource(_llm, doc="the LLM backend of `llm.backend`"),
    "embedder": Resource(_embedder, doc="the sentence embedder"),
    "reranker": Resource(_reranker, doc="the cross-encoder of `references.rerank` (None without a model)"),
    "kg": Resource(_kg_client, doc="the KG client (None when no server answered)"),
    "hash_model": Resource(_hash_model, ("embedder",), "HASH-RAG's hash layer (retriever hash only)"),
    "r2former": Resource(_r2former, ("llm", "embedder"), "the R2AG head (r2ag.enabled only)"),
}.items():
    add_resource(_name, _resource, __name__)
