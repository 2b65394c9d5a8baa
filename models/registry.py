"""A typed registry of classes by name: duplicates refused, a miss answered with the closest names, and entries that
are imported only when first asked for. Stages (models/stages/stage.py STAGES), LLM backends (models/llm/backends.py
BACKENDS) and judges (evaluation/judge.py JUDGES) are registered in one."""

from __future__ import annotations

import importlib
import typing
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from utils.errors import HarnessError
from utils.names import did_you_mean

T = TypeVar("T")


class RegistryError(HarnessError, ValueError):
    """An unknown name, a name taken twice, or a class of the wrong kind; the message says which."""


class Registry(Generic[T]):
    """`kind` names what is registered in messages ("stage"); every entry must subclass `base`."""

    def __init__(self, kind: str, base: type) -> None:  # `type`: a Protocol (LLM) is a base too
        self.kind = kind
        self.base = base
        self._entries: dict[str, type[T] | str] = {}  # a class, or "module:Class" until first asked for

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: `@STAGES.register("references")`."""

        def add(cls: type[T]) -> type[T]:
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise RegistryError(f"{self.kind} {name!r}: {cls!r} is not a subclass of {self.base.__name__}")
            if name in self._entries and self._entries[name] is not cls:
                taken = self._entries[name]
                where = taken if isinstance(taken, str) else f"{taken.__module__}.{taken.__qualname__}"
                raise RegistryError(f"{self.kind} {name!r} is already registered by {where}")
            self._entries[name] = cls
            return cls

        return add

    def register_lazy(self, name: str, target: str) -> None:
        """`name` for the class at `target` ("module:Class"), imported on first `get`: a choice that needs a
        package another install lacks (vllm on a CPU) costs nothing until it is chosen."""
        if name in self._entries and self._entries[name] != target:
            raise RegistryError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = target

    def get(self, name: str) -> type[T]:
        if name not in self._entries:
            raise RegistryError(f"unknown {self.kind} {name!r}{did_you_mean(name, sorted(self._entries))}")
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            cls = getattr(importlib.import_module(module), attribute)
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise RegistryError(f"{self.kind} {name!r}: {entry} is not a subclass of {self.base.__name__}")
            self._entries[name] = entry = typing.cast(type[T], cls)
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
