"""Reading a config: a YAML file (else $CRAG_CONFIG, else configs/cpu.yaml), overlays merged key by key and `--set`
assignments (`read_config`), each key then checked against the schema (models/config/schema.py) and the sections
the registered stages declare (`build_config`): an unknown key, a wrong type, a choice or range it breaks is a
ConfigError naming the file, the key and the closest name. models/loading.py `load_config` does both, with the
stage modules imported in between: this package imports no stage."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from models.config.schema import (
    CORE_SECTIONS,
    REPO_ROOT,
    STAGE_SECTIONS,
    SystemConfig,
    declared_sections,
)
from models.config.validation import public_fields, validate
from utils.errors import ConfigError
from utils.names import did_you_mean

DEFAULT_CONFIG = REPO_ROOT / "configs" / "cpu.yaml"
CONFIG_ENV = "CRAG_CONFIG"


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config, --overlay and --set, the same in every command that builds the system."""
    parser.add_argument("--config", type=Path, default=None,
                        help=f"system config YAML (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG.name})")
    parser.add_argument("--overlay", type=Path, action="append", default=[], metavar="YAML",
                        help="a partial config merged over --config key by key (repeatable; configs/overlays/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                        help="one setting over the config, e.g. --set kg.method=functions (repeatable; YAML value)")


def config_path(path: str | os.PathLike | None = None) -> Path:
    """`path`, else $CRAG_CONFIG, else configs/cpu.yaml."""
    return Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def read_config(path: str | os.PathLike | None = None, overlays: Sequence[str | os.PathLike] = (),
                sets: Sequence[str] = ()) -> tuple[dict[str, Any], str]:
    """The data of `path` (else $CRAG_CONFIG, else configs/cpu.yaml), then of each overlay file in order (a partial
    config merged key by key), then of each `--set` assignment ("kg.method=functions", the value read as YAML);
    and where it came from, for messages."""
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
    return data, source


def build_config(data: dict[str, Any], source: str, modules: Sequence[str]) -> SystemConfig:
    """The config of `data`, checked against the schema and every registered stage's sections; `modules` are the
    stage modules (built-in and the config's own, imported by the caller) whose sections every config holds."""
    declared = {key: data.pop(key) for key in list(data) if key in STAGE_SECTIONS and key not in CORE_SECTIONS}
    for key in [key for key in STAGE_SECTIONS if key in CORE_SECTIONS and isinstance(data.get(key), dict)]:
        declared[key] = _split(key, data, source)
    keys = list(dict.fromkeys([*public_fields(SystemConfig), *STAGE_SECTIONS]))
    for key in data:  # checked here: pydantic would take the fields the loader sets (source) as keys
        if key not in keys:
            raise ConfigError(f"{source}: unknown key '{key}'{did_you_mean(key, keys)}")
    config = validate(SystemConfig, {**_with_tables(data), "source": source}, source)
    # the built-in stages' sections and the configured modules' are in every config, defaults or not, so the
    # resolved config (and its hash) depends on the config alone, never on what this process imported before
    named = [name for name in config.strategy_names() if name in STAGE_SECTIONS]
    wanted = {*declared, *named, *declared_sections(modules)}
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
    core = public_fields(CORE_SECTIONS[name])
    declared = [key for _, settings in STAGE_SECTIONS[name] for key in public_fields(settings)]
    _refuse_unknown(name, section, [*core, *declared], source)
    data[name] = {key: value for key, value in section.items() if key in core}
    return {key: value for key, value in section.items() if key in declared}


def _parts(name: str, data: Any, source: str) -> list[Any]:
    """The declared section `name` from its mapping: each part built from its own keys; a key no part declares is
    refused with the closest of all of them. A part's `check(config)`, where it has one, runs once the whole config
    is built (a ValueError is a config error)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{name}' must be a mapping")
    parts = [(settings, public_fields(settings)) for _, settings in STAGE_SECTIONS[name]]
    _refuse_unknown(name, data, [key for _, keys in parts for key in keys], source)
    return [validate(settings, {k: v for k, v in data.items() if k in keys}, source, f"{name}.")
            for settings, keys in parts]


def _refuse_unknown(name: str, section: dict[str, Any], known: list[str], source: str) -> None:
    """A key of section `name` that none of its parts declares is refused, with the closest of them all (each part
    is checked alone, against its own keys)."""
    for key in section:
        if key not in known:
            raise ConfigError(f"{source}: unknown key '{name}.{key}'{did_you_mean(key, known)}")


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


def _with_tables(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with each table SystemConfig adds to its defaults (field metadata `merge`: strategies) merged over
    them, the lists inside its lists spliced in (YAML aliases of shared stage lists)."""
    merged = dict(data)
    for f in dataclasses.fields(SystemConfig):
        if f.metadata.get("merge") and isinstance(data.get(f.name), dict):
            defaults = copy.deepcopy(typing.cast(Callable[[], Any], f.default_factory)())
            merged[f.name] = {**defaults, **{key: _splice(value) for key, value in data[f.name].items()}}
    return merged


def _splice(value: Any) -> Any:
    """A list with the lists inside it spliced in."""
    if not isinstance(value, list):
        return value
    return [item for part in value for item in (part if isinstance(part, list) else [part])]
