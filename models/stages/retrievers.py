"""Retrievers of the references stage (`references.retriever`): how a query's embedded candidates are ranked
before the re-ranker and the top-k. `dense` ranks them by cosine. A retriever that needs more (HASH-RAG's hash
index, models/stages/hash_retriever.py) declares it on its class, as a stage does: keys of the `references`
section, QueryState fields, resources, the prompts it renders, the resources it needs and the gate signals it
writes; registering it registers them, and makes its name a value `references.retriever` takes. What a retriever
declares becomes the references stage's (`RETRIEVERS.on_register`), whether it registers with the built-in ones or
later, from a config's `stage_modules`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from models.registry import Registry
from models.resources import Resource
from models.stages.stage import declaring
from models.state import QueryState, Reference, StateField

if TYPE_CHECKING:
    from models.stages.stage import StageContext


@dataclass
class Pool:
    """A query's ranked pool: candidate indices, their scores, and (hash retrieval) the best unit of each."""

    indices: list[int]
    scores: np.ndarray
    units: list[int] | None = None


class Retriever:
    """Ranks each query's candidates; one instance per batch of the references stage."""

    name: ClassVar[str] = ""
    settings: ClassVar[type | None] = None  # keys of the `references` section (a dataclass)
    fields: ClassVar[tuple[StateField[Any], ...]] = ()
    resources: ClassVar[dict[str, Resource]] = {}
    prompts: ClassVar[tuple[str, ...]] = ()
    needs: ClassVar[frozenset[str]] = frozenset()
    signals: ClassVar[dict[str, str]] = {}  # the answer gate's signals it writes: name -> what it means

    def prepare(self, states: list[QueryState], per_query: list[list[Reference]], blocks: list[np.ndarray],
                queries: np.ndarray, ctx: StageContext) -> None:
        """Work for the whole batch before any query is ranked (`per_query`, `blocks` and `queries`: each query's
        candidates, their embeddings and its own, aligned with `states`)."""

    def pool(self, number: int, refs: list[Reference], query: np.ndarray, block: np.ndarray,
             ctx: StageContext) -> Pool:
        """The ranked pool of the batch's query `number`."""
        raise NotImplementedError

    def kept(self, number: int, state: QueryState, refs: list[Reference], pool: Pool, chosen: list[int],
             ctx: StageContext) -> None:
        """What the retriever writes on the query once its references are chosen (`chosen`: positions in `pool`)."""


class RetrieverRegistry(Registry[Retriever]):
    """Retrievers by name; registering one registers what it declares, makes its name a choice of
    `references.retriever`, and tells every listener (`on_register`)."""

    def __init__(self, kind: str, base: type) -> None:
        super().__init__(kind, base)
        self._listeners: list[Callable[[type[Retriever]], None]] = []

    def register(self, name: str) -> Callable[[type[Retriever]], type[Retriever]]:
        add = super().register(name)

        def declare(cls: type[Retriever]) -> type[Retriever]:
            if not (isinstance(cls, type) and issubclass(cls, Retriever)):
                return add(cls)  # refused there, with the base class named
            sections = [("references", cls.settings, True)] if cls.settings is not None else []
            with declaring(f"retriever {name!r}", cls.__module__, sections, cls.fields, cls.resources,
                           choices=[("retriever", name)]):
                registered = add(cls)
            cls.name = name
            for listener in self._listeners:
                listener(cls)
            return registered

        return declare

    def on_register(self, listener: Callable[[type[Retriever]], None]) -> None:
        """Call `listener` with every retriever registered so far, in order, and with each one registered later."""
        self._listeners.append(listener)
        for name in self:
            listener(self.get(name))


RETRIEVERS = RetrieverRegistry("retriever", Retriever)


def split_rows(rows: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """Consecutive blocks of `rows`, of the given sizes."""
    return np.split(rows, np.cumsum(sizes)[:-1]) if sizes else []


@RETRIEVERS.register("dense")
class DenseRetriever(Retriever):
    """Cosine over the candidates' embeddings."""

    def pool(self, number: int, refs: list[Reference], query: np.ndarray, block: np.ndarray,
             ctx: StageContext) -> Pool:
        return Pool(list(range(len(refs))), block @ query)
