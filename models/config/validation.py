"""Checking a config section's keys with pydantic, in strict mode: a section is a standard dataclass whose fields
are its keys; ranges are `annotated_types` constraints (`Annotated[int, Ge(1)]`), a registry's names are `Choice`.
pydantic's first error becomes one line naming the file, the key and, for a misspelt key or value, the closest name.

The values come from YAML, so they are checked as JSON: pydantic's strict mode reads a JSON object as a dataclass
(a Python dict it would refuse), and refuses a bool or a string for an int, an int for a str."""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, GetCoreSchemaHandler, PydanticUserError, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError, core_schema
from pydantic_core.core_schema import CoreSchema

from utils.errors import ConfigError
from utils.names import did_you_mean

# A standard dataclass validated inside a container takes the container's config; the field docstrings become the
# JSON schema's descriptions, which the configuration reference prints.
STRICT = ConfigDict(strict=True, extra="forbid", use_attribute_docstrings=True)

# The choices of keys whose values name what a registry holds (a `Choice(table)` field): table -> names, in
# registration order (`references.retriever` takes a name of the references stage's retrievers).
CHOICES: dict[str, list[str]] = {}

_TYPE_ERRORS = {"int_type": "int", "float_type": "float", "string_type": "str", "bool_type": "bool"}
_MAPPING_ERRORS = {"dataclass_type", "dict_type"}
_RANGE_ERRORS = {"greater_than_equal", "less_than_equal", "greater_than", "less_than"}


def add_choice(table: str, name: str) -> None:
    """Make `name` one of the values the keys of `table` take."""
    CHOICES.setdefault(table, [])
    if name not in CHOICES[table]:
        CHOICES[table] = [*CHOICES[table], name]


@dataclass(frozen=True)
class Choice:
    """Field metadata (`Annotated[str, Choice("retriever")]`): the value is a name in CHOICES[table], read when a
    config is checked, so a name registered after the schema was built is a choice."""

    table: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: Any) -> Any:
        if value not in CHOICES.get(self.table, []):
            raise PydanticCustomError("choice", "not a registered name", {"choices": CHOICES.get(self.table, [])})
        return value


@dataclass(frozen=True)
class NotABool:
    """Field metadata of an int Literal (`Annotated[Literal[1, 2, 3], NotABool()]`): pydantic reads JSON true as the
    literal 1; a bool is refused as a value outside the choices."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_before_validator_function(self._check, handler(source))

    def _check(self, value: Any) -> Any:
        if isinstance(value, bool):
            raise PydanticCustomError("literal_error", "a bool is not one of the choices")
        return value


def bounds(metadata: Iterable[Any]) -> tuple[float | None, float | None]:
    """The lowest and highest values the `annotated_types` constraints in `metadata` allow (None: unbounded)."""
    low = high = None
    for item in metadata:
        low = getattr(item, "ge", low)
        high = getattr(item, "le", high)
    return low, high


def range_text(low: float | None, high: float | None) -> str:
    """Bounds as text: "at least 0", "at most 1", "0..1"; "" for none."""
    if low is None:
        return "" if high is None else f"at most {high}"
    return f"at least {low}" if high is None else f"{low}..{high}"


def unwrap(hint: Any) -> tuple[Any, list[Any]]:
    """A field's type without `Annotated` and `None` (of an optional key), and the `Annotated` metadata."""
    metadata: list[Any] = []
    while True:
        if typing.get_origin(hint) is Annotated:
            metadata += hint.__metadata__
            hint = hint.__origin__
        elif typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint):
            (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        else:
            return hint, metadata


def public_fields(cls: type) -> list[str]:
    """The keys of a section: its dataclass fields, less those the loader sets (metadata `internal`)."""
    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


@functools.cache
def adapter(cls: type) -> TypeAdapter[dict[str, Any]]:
    """pydantic's validator of a section: a field type it cannot check is a ConfigError naming the class."""
    try:
        return TypeAdapter(dict[str, cls], config=STRICT)  # type: ignore[valid-type]  # a class known at run time
    except PydanticUserError as err:  # PydanticSchemaGenerationError among them
        raise ConfigError(f"{cls.__module__}.{cls.__qualname__}: a config section's fields must be types pydantic "
                          f"checks: {str(err).splitlines()[0]}") from err


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a section's fields, whitespace folded, as pydantic reads them."""
    schema = adapter(cls).json_schema()
    defs = schema["$defs"]
    docs = {}
    for key, spec in defs[schema["additionalProperties"]["$ref"].rsplit("/", 1)[-1]].get("properties", {}).items():
        if "description" not in spec and "$ref" in spec:  # pydantic leaves out a section's doc equal to its class's
            spec = defs[spec["$ref"].rsplit("/", 1)[-1]]
        if "description" in spec:
            docs[key] = " ".join(spec["description"].split())
    return docs


def validate(cls: type, data: dict[str, Any], source: str, prefix: str = "") -> Any:
    """`cls` (a dataclass) from `data`, every key checked in strict mode. A bad key is a ConfigError naming
    `source` and the key (`prefix` before it). A ValueError of the dataclass's own checks (`__post_init__`) names
    `source`."""
    def refuse(value: Any) -> Any:
        raise ConfigError(f"{source}: {value!r} is not a string, number, bool, list or mapping; quote it in the YAML")

    try:
        return adapter(cls).validate_json(json.dumps({"": data}, default=refuse))[""]
    except ValidationError as err:
        error = err.errors()[0]
        if error["type"] == "value_error":
            cause = error["ctx"]["error"]
            raise (cause if isinstance(cause, ConfigError) else ConfigError(f"{source}: {cause}")) from None
        raise ConfigError(f"{source}: {_message(cls, error, prefix)}") from None


def _message(cls: type, error: Any, prefix: str) -> str:
    loc = error["loc"][1:]
    where = prefix + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    kind, value = error["type"], error["input"]
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        parent, _ = _hint_at(cls, loc[:-1])
        return f"unknown key '{where}'{did_you_mean(loc[-1], public_fields(parent))}"
    if kind in _TYPE_ERRORS:
        return f"'{where}' must be {_TYPE_ERRORS[kind]}, got {value!r}"
    if kind in _MAPPING_ERRORS:
        return f"'{where}' must be a mapping"
    if kind == "list_type":
        return f"'{where}' must be a list"
    if kind in ("literal_error", "choice"):
        hint, _ = _hint_at(cls, loc)
        choices = typing.get_args(hint) if typing.get_origin(hint) is Literal else error["ctx"]["choices"]
        return f"'{where}' is {value!r}{did_you_mean(value, choices)}"
    if kind in _RANGE_ERRORS:
        low, high = bounds(_hint_at(cls, loc)[1])
        allowed = range_text(low, high) if low is None or high is None else f"in {range_text(low, high)}"
        return f"'{where}' must be {allowed}, got {value!r}"
    return f"'{where}': {error['msg']}"


def _hint_at(cls: type, loc: Sequence[Any]) -> tuple[Any, list[Any]]:
    """The type of the key at `loc` (field names, list indices, mapping keys) under `cls`, unwrapped."""
    hint: Any = cls
    metadata: list[Any] = []
    for part in loc:
        if dataclasses.is_dataclass(hint):
            hint = typing.get_type_hints(hint, include_extras=True)[part]
        else:
            hint = typing.get_args(hint)[-1]  # a list's items, a mapping's values
        hint, metadata = unwrap(hint)
    return hint, metadata
