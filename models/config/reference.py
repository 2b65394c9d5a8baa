"""Every key the loader accepts, as the generated configuration reference shows it (docs/reference/config.md,
`make docs`): read from the schema's dataclasses, their attribute docstrings and the sections stages declare."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from models.config.loader import import_stage_modules
from models.config.schema import CHOICES, CORE_SECTIONS, STAGE_MODULES, STAGE_SECTIONS, SystemConfig
from models.config.sections import range_text


@dataclass(frozen=True)
class ConfigKey:
    """One key a config file may set, as the reference page (docs/reference/config.md, `make docs`) shows it."""

    key: str      # dotted: "llm.hf.max_input_tokens"
    type: str     # readable: "int", "str | None", "list[str]"; "section" for a nested mapping
    default: str  # as YAML writes it ("" for a section: its keys follow it)
    allowed: str  # the choices or the range, as text, else ""
    doc: str      # the field's attribute docstring, on one line


def config_keys() -> list[ConfigKey]:
    """Every key the loader accepts, in declaration order: a section, then its keys. A dict-valued key
    (`strategies`, `prompts`, `budget.stage_min_s`) is one entry."""
    import_stage_modules(STAGE_MODULES, "the built-in stages")
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


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string literal right after each field), whitespace folded."""
    (node,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    assert isinstance(node, ast.ClassDef)
    docs: dict[str, str] = {}
    for statement, after in zip(node.body, node.body[1:]):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[statement.target.id] = " ".join(after.value.value.split())
    return docs


def _section_keys(cls: type, prefix: str) -> typing.Iterator[ConfigKey]:
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key, hint, doc = prefix + f.name, hints[f.name], docs.get(f.name, "")
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            yield ConfigKey(key, "section", "", "", doc)
            yield from _section_keys(hint, f"{key}.")
        else:
            default = f.default if f.default is not dataclasses.MISSING else (
                typing.cast(typing.Callable[[], Any], f.default_factory)())
            yield ConfigKey(key, _type_text(hint), yaml_text(default), _allowed_text(hint, f.metadata), doc)


def yaml_text(value: Any) -> str:
    """`value` as YAML writes it on one line: null, true, 0.5, '', [a, b], {a: 1}."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=float("inf"))
    return text.removesuffix("...\n").strip()


def _type_text(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return " | ".join(dict.fromkeys(type(choice).__name__ for choice in args))
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if arg is type(None) else _type_text(arg) for arg in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_text(arg) for arg in args)}]"
    return hint.__name__


def _allowed_text(hint: Any, metadata: typing.Mapping[str, Any]) -> str:
    if table := metadata.get("choices"):
        return ", ".join(CHOICES.get(table, []))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return ", ".join(str(choice) for choice in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(filter(None, (_allowed_text(arg, {}) for arg in args if arg is not type(None))))
    if origin is list:
        inner = _allowed_text(args[0], {})
        return f"each: {inner}" if inner else ""
    return range_text(*metadata.get("range", (None, None)))
