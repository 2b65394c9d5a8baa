"""Loading a config: a YAML file (else $CRAG_CONFIG, else configs/cpu.yaml), overlays merged key by key and `--set`
assignments, each key checked against the schema (models/config/schema.py) as it loads: an unknown key, a wrong
type, a choice or range it breaks is a ConfigError naming the file, the key and the closest name."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from models.config.schema import (
    CHOICES,
    CORE_SECTIONS,
    REPO_ROOT,
    STAGE_MODULES,
    STAGE_SECTIONS,
    SystemConfig,
    declared_sections,
)
from models.config.sections import range_text
from utils.errors import ConfigError
from utils.names import did_you_mean

DEFAULT_CONFIG = REPO_ROOT / "configs" / "cpu.yaml"
CONFIG_ENV = "CRAG_CONFIG"


def import_stage_modules(modules: Sequence[str], source: str) -> None:
    """Import the config's `stage_modules`, so the stages, settings and fields they declare are registered. A module
    is imported as Python finds it: from an installed package, or from the working folder where the command runs
    (the grader's is the repository's root)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"{source}: stage_modules: cannot import {module!r}: {err}; a stage module must be "
                              "importable where the command runs: run it from the folder that holds the package, "
                              "set PYTHONPATH to that folder, or install the package") from err


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config, --overlay and --set, the same in every command that builds the system."""
    parser.add_argument("--config", type=Path, default=None,
                        help=f"system config YAML (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG.name})")
    parser.add_argument("--overlay", type=Path, action="append", default=[], metavar="YAML",
                        help="a partial config merged over --config key by key (repeatable; configs/overlays/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                        help="one setting over the config, e.g. --set kg.method=functions (repeatable; YAML value)")


def config_from_args(args: argparse.Namespace) -> SystemConfig:
    return load_config(args.config, args.overlay, args.sets)


def config_path(path: str | os.PathLike | None = None) -> Path:
    """`path`, else $CRAG_CONFIG, else configs/cpu.yaml."""
    return Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def load_config(path: str | os.PathLike | None = None, overlays: Sequence[str | os.PathLike] = (),
                sets: Sequence[str] = ()) -> SystemConfig:
    """Load `path` (else $CRAG_CONFIG, else configs/cpu.yaml), then each overlay file in order (a partial config
    merged key by key), then each `--set` assignment ("kg.method=functions", the value read as YAML)."""
    chosen = config_path(path)
    data = _read_yaml(chosen, f"set {CONFIG_ENV} or --config to an existing YAML file")
    source = str(chosen)
    for overlay in overlays:
        data = _merge(data, _read_yaml(Path(overlay), "--overlay takes a partial config YAML file"))
        source += f" + {overlay}"
    for assignment in sets:
        key, sep, text = assignment.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {assignment!r}: write KEY=VALUE, e.g. --set kg.method=functions")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {assignment!r}: the value is not YAML: {err}") from err
        for part in reversed(key.strip().split(".")):
            value = {part: value}
        data = _merge(data, value)
        source += f" --set {key.strip()}"
    modules = data.get("stage_modules") or []
    modules = [str(m) for m in modules] if isinstance(modules, list) else []  # anything else: refused by key
    import_stage_modules([*STAGE_MODULES, *modules], source)
    declared = {key: data.pop(key) for key in list(data) if key in STAGE_SECTIONS and key not in CORE_SECTIONS}
    for key in [key for key in STAGE_SECTIONS if key in CORE_SECTIONS and isinstance(data.get(key), dict)]:
        declared[key] = _split(key, data, source)
    config = _build(SystemConfig, data, source, "", {"source": source}, also=STAGE_SECTIONS)
    # the built-in stages' sections and the configured modules' are in every config, defaults or not, so the
    # resolved config (and its hash) depends on the config alone, never on what this process imported before
    named = [name for name in config.strategy_names() if name in STAGE_SECTIONS]
    wanted = {*declared, *named, *declared_sections([*STAGE_MODULES, *modules])}
    config.stage_settings = {name: _parts(name, declared.get(name, {}), source) for name in sorted(wanted)}
    for part in (part for parts in config.stage_settings.values() for part in parts):
        if callable(check := getattr(part, "check", None)):
            try:
                check(config)
            except ValueError as err:  # a check across sections (the hash retriever's model)
                raise ConfigError(f"{source}: {err}") from err
    return config


def _split(name: str, data: dict[str, Any], source: str) -> dict[str, Any]:
    """Of SystemConfig's section `name` in `data`, the keys stages declare in it (`Stage.section_keys`), taken out;
    a key neither declares is refused with the closest of both."""
    section = data[name]
    core = {f.name for f in dataclasses.fields(CORE_SECTIONS[name])}
    declared = {f.name for _, settings in STAGE_SECTIONS[name] for f in dataclasses.fields(settings)}
    for key in section:
        if key not in core | declared:
            raise ConfigError(f"{source}: unknown key '{name}.{key}'{did_you_mean(key, [*core, *declared])}")
    data[name] = {key: value for key, value in section.items() if key in core}
    return {key: value for key, value in section.items() if key in declared}


def _parts(name: str, data: Any, source: str) -> list[Any]:
    """The declared section `name` from its mapping: each part built from its own keys; a key no part declares is
    refused with the closest of all of them. A part's `check(config)`, where it has one, runs once the whole config
    is built (a ValueError is a config error)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{name}' must be a mapping")
    parts = [settings for _, settings in STAGE_SECTIONS[name]]
    fields = [{f.name for f in dataclasses.fields(settings)} for settings in parts]
    for key in data:
        if not any(key in keys for keys in fields):
            known = [key for keys in fields for key in sorted(keys)]
            raise ConfigError(f"{source}: unknown key '{name}.{key}'{did_you_mean(key, known)}")
    return [_build(settings, {k: v for k, v in data.items() if k in keys}, source, f"{name}.")
            for settings, keys in zip(parts, fields)]


def _read_yaml(path: Path, fix: str) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found ({fix})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in: mappings key by key, anything else replaced."""
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = (_merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict)
                       else value)
    return merged


def _build(cls: type, data: dict[str, Any], source: str, prefix: str, extra: dict[str, Any] | None = None,
           also: typing.Iterable[str] = ()) -> Any:
    """`cls` from `data`, each key checked and coerced; `also`: other keys of this level (the declared sections),
    for the closest name of an unknown one. A ValueError of the dataclass's own checks names the source."""
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = dict(extra or {})
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key not in known or known[key].metadata.get("internal"):
            public = [name for name, f in known.items() if not f.metadata.get("internal")] + list(also)
            raise ConfigError(f"{source}: unknown key '{where}'{did_you_mean(key, public)}")
        meta = known[key].metadata
        if meta.get("merge") and isinstance(value, dict):  # a table added to its defaults (strategies)
            defaults = typing.cast(typing.Callable[[], dict[str, Any]], known[key].default_factory)()
            value = {**defaults, **{k: _splice(v) for k, v in value.items()}}
        kwargs[key] = _coerce(hints[key], value, source, where)
        if (table := meta.get("choices")) and kwargs[key] not in (names := CHOICES.get(table, [])):
            raise ConfigError(f"{source}: '{where}' is {kwargs[key]!r}{did_you_mean(kwargs[key], names)}")
        low, high = meta.get("range", (None, None))
        if kwargs[key] is not None and (
                (low is not None and kwargs[key] < low) or (high is not None and kwargs[key] > high)):
            allowed = range_text(low, high) if low is None or high is None else f"in {range_text(low, high)}"
            raise ConfigError(f"{source}: '{where}' must be {allowed}, got {kwargs[key]!r}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as err:  # a check across the section's keys (R2AGSettings.__post_init__)
        raise ConfigError(f"{source}: {err}") from err


def _splice(value: Any) -> Any:
    """A list with the lists inside it spliced in (YAML aliases of shared stage lists)."""
    if not isinstance(value, list):
        return value
    return [item for part in value for item in (part if isinstance(part, list) else [part])]


def _coerce(hint: Any, value: Any, source: str, where: str) -> Any:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: '{where}' must be a mapping")
        return _build(hint, value, source, f"{where}.")
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices or isinstance(value, bool):
            raise ConfigError(f"{source}: '{where}' is {value!r}{did_you_mean(value, choices)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(inner, value, source, where)
    if origin is list:
        (item_t,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: '{where}' must be a list")
        return [_coerce(item_t, item, source, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        key_t, val_t = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: '{where}' must be a mapping")
        return {
            _coerce(key_t, k, source, f"{where}.{k}"): _coerce(val_t, v, source, f"{where}.{k}")
            for k, v in value.items()
        }
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ConfigError(f"{source}: '{where}' must be {hint.__name__}, got {value!r}")
    return value
