"""Every key the loader accepts, as the generated configuration reference shows it (docs/reference/config.md,
`make docs`): read from the schema's dataclasses, their attribute docstrings (as pydantic reads them) and the
sections stages declare."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from models.config.schema import CORE_SECTIONS, STAGE_SECTIONS, SystemConfig
from models.config.validation import CHOICES, Choice, bounds, field_docs, range_text, unwrap


@dataclass(frozen=True)
class ConfigKey:
    """One key a config file may set, as the reference page (docs/reference/config.md, `make docs`) shows it."""

    key: str      # dotted: "llm.hf.micro_batch_size"
    type: str     # readable: "int", "str | None", "list[str]"; "section" for a nested mapping
    default: str  # as YAML writes it ("" for a section: its keys follow it)
    allowed: str  # the choices or the range, as text, else ""
    doc: str      # the field's attribute docstring, on one line


def config_keys() -> list[ConfigKey]:
    """Every key the loader accepts, in declaration order: a section, then its keys (the sections of the stages
    registered so far: models/loading.py registers the built-in ones). A dict-valued key (`strategies`, `prompts`,
    `budget.stage_min_s`) is one entry."""
    keys = list(_section_keys(SystemConfig, ""))
    for name, parts in sorted(STAGE_SECTIONS.items()):
        added = [key for _, settings in parts for key in _section_keys(settings, f"{name}.")]
        if name in CORE_SECTIONS:  # keys stages add to a SystemConfig section: after its own
            last = max(i for i, key in enumerate(keys) if key.key == name or key.key.startswith(f"{name}."))
            keys[last + 1:last + 1] = added
            continue
        doc = " ".join(" ".join((settings.__doc__ or "").split()) for _, settings in parts)
        keys += [ConfigKey(name, "section", "", "", doc), *added]
    return keys


def _section_keys(cls: type, prefix: str) -> typing.Iterator[ConfigKey]:
    hints, docs = typing.get_type_hints(cls, include_extras=True), field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key, doc = prefix + f.name, docs.get(f.name, "")
        hint, metadata = unwrap(hints[f.name])
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            yield ConfigKey(key, "section", "", "", doc)
            yield from _section_keys(hint, f"{key}.")
        else:
            default = f.default if f.default is not dataclasses.MISSING else (
                typing.cast(typing.Callable[[], Any], f.default_factory)())
            yield ConfigKey(key, _type_text(hints[f.name]), yaml_text(default), _allowed_text(hint, metadata), doc)


def yaml_text(value: Any) -> str:
    """`value` as YAML writes it on one line: null, true, 0.5, '', [a, b], {a: 1}."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=float("inf"))
    return text.removesuffix("...\n").strip()


def _type_text(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _type_text(args[0])
    if origin is Literal:
        return " | ".join(dict.fromkeys(type(choice).__name__ for choice in args))
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if arg is type(None) else _type_text(arg) for arg in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_text(arg) for arg in args)}]"
    return hint.__name__


def _allowed_text(hint: Any, metadata: list[Any]) -> str:
    """The choices or the range of a key whose type is `hint` (unwrapped) and `Annotated` metadata `metadata`."""
    if choice := next((item for item in metadata if isinstance(item, Choice)), None):
        return ", ".join(CHOICES.get(choice.table, []))
    if typing.get_origin(hint) is Literal:
        return ", ".join(str(choice) for choice in typing.get_args(hint))
    if typing.get_origin(hint) is list:
        inner = _allowed_text(*unwrap(typing.get_args(hint)[0]))
        return f"each: {inner}" if inner else ""
    return range_text(*bounds(metadata))
