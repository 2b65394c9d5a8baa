"""A typed registry of classes by name: duplicates refused, a miss answered with the closest names."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from utils.errors import HarnessError
from utils.names import closest

T = TypeVar("T")


class RegistryError(HarnessError, ValueError):
    """An unknown name, a name taken twice, or a class of the wrong kind; the message says which."""


class Registry(Generic[T]):
    """`kind` names what is registered in messages ("stage"); every entry must subclass `base`."""

    def __init__(self, kind: str, base: type[T]) -> None:
        self.kind = kind
        self.base = base
        self._entries: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: `@STAGES.register("references")`."""

        def add(cls: type[T]) -> type[T]:
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise RegistryError(f"{self.kind} {name!r}: {cls!r} is not a subclass of {self.base.__name__}")
            if name in self._entries and self._entries[name] is not cls:
                taken = self._entries[name]
                raise RegistryError(f"{self.kind} {name!r} is already registered by "
                                    f"{taken.__module__}.{taken.__qualname__}")
            self._entries[name] = cls
            return cls

        return add

    def get(self, name: str) -> type[T]:
        if name not in self._entries:
            raise RegistryError(f"unknown {self.kind} {name!r}{self.suggestion(name)}")
        return self._entries[name]

    def suggestion(self, name: str) -> str:
        """'; did you mean 'x'?' for the closest registered name, else the list of names."""
        close = closest(name, self._entries)
        return f"; did you mean {close!r}?" if close else f"; known: {', '.join(sorted(self._entries))}"

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)
