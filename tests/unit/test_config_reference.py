"""config_keys(), the list behind the generated reference page, against the loader; and the shipped configs, which
set only what differs from the dataclass defaults."""

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

import models.loading  # noqa: F401  (the built-in stages declare their sections)
from models.config import REPO_ROOT, STAGE_SECTIONS, ConfigError, SystemConfig, yaml_text
from models.loading import config_keys, load_config
from tests.conftest import write

CONFIGS = REPO_ROOT / "configs"
BASES = sorted(CONFIGS.glob("*.yaml"))
OVERLAYS = sorted((CONFIGS / "overlays").glob("*.yaml"))


def accepted_keys() -> dict[str, tuple[bool, Any]]:
    """Every key the loader accepts, found by walking SystemConfig's dataclasses and those of the sections stages
    declare: dotted key -> (is a section, its field; None for a declared section)."""
    found = fields_of(SystemConfig, "")
    for name, parts in STAGE_SECTIONS.items():
        found[name] = (True, None)
        for _, settings in parts:
            found.update(fields_of(settings, f"{name}."))
    return found


def fields_of(cls: type, prefix: str) -> dict[str, tuple[bool, Any]]:
    hints = typing.get_type_hints(cls)
    found: dict[str, tuple[bool, Any]] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        section = dataclasses.is_dataclass(hints[f.name])
        found[prefix + f.name] = (section, f)
        if section:
            found.update(fields_of(hints[f.name], f"{prefix}{f.name}."))
    return found


KEYS = accepted_keys()
DEFAULTS = SystemConfig(stage_settings={name: [settings() for _, settings in parts]
                                        for name, parts in STAGE_SECTIONS.items()})
LEAVES = [key for key, (section, _) in KEYS.items() if not section]
LISTED = config_keys()


def value_of(config: SystemConfig, key: str) -> Any:
    """The value of a dotted key, as plain data (a section's or a table's as a mapping)."""
    value: Any = config.resolved()
    for part in key.split("."):
        value = value[part]
    return value


def default_of(key: str) -> Any:
    return value_of(DEFAULTS, key)


def leaves(data: dict[str, Any], prefix: str = "") -> typing.Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf a config file sets; a dict-valued key (strategies, stage_min_s) is a leaf."""
    for name, value in data.items():
        key = prefix + name
        if KEYS.get(key, (False, None))[0] and isinstance(value, dict):
            yield from leaves(value, f"{key}.")
        else:
            yield key, value


def is_default(key: str, value: Any) -> bool:
    """Whether setting `key` to `value` leaves it at its dataclass default (a merged table: added to the defaults)."""
    _, f = KEYS[key]
    if f.metadata.get("merge") and isinstance(value, dict):
        value = {**f.default_factory(), **value}
    return value == default_of(key)


def base_values() -> dict[str, list[Any]]:
    """The values the shipped base configs give each key they set."""
    found: dict[str, list[Any]] = {}
    for path in BASES:
        for key, value in leaves(yaml.safe_load(path.read_text(encoding="utf-8")) or {}):
            found.setdefault(key, []).append(value)
    return found


# Named by every shipped config whatever its default: the model a config runs is read where the config is read.
NAMED_ALWAYS = ("llm.profile",)


def restated_defaults(path: Path, overlay: bool = False) -> list[str]:
    """The keys `path` sets to their dataclass default, as "file: key = value (the default)", less NAMED_ALWAYS. An
    overlay may set a key to its default where a shipped base config sets it to another value (it restores the
    default there)."""
    bases = base_values() if overlay else {}
    found = []
    for key, value in leaves(yaml.safe_load(path.read_text(encoding="utf-8")) or {}):
        if key in NAMED_ALWAYS:
            continue
        if is_default(key, value) and not (overlay and any(not is_default(key, v) for v in bases.get(key, []))):
            found.append(f"{path.name}: {key} = {yaml_text(value)} (the default)")
    return found


def test_config_keys_are_exactly_the_keys_the_loader_accepts():
    listed = [k.key for k in config_keys()]
    assert len(listed) == len(set(listed))
    assert set(listed) == set(KEYS)
    sections = {k.key for k in config_keys() if k.type == "section"}
    assert sections == {key for key, (section, _) in KEYS.items() if section}


@pytest.mark.parametrize("key", LEAVES)
def test_each_listed_leaf_loads_with_its_listed_default(tmp_path, key):
    (entry,) = [k for k in LISTED if k.key == key]
    config = load_config(write(tmp_path / "empty.yaml", ""), sets=[f"{key}={entry.default}"])
    assert value_of(config, key) == default_of(key) and entry.type and entry.type != "section"


@pytest.mark.parametrize("key", ["made_up", "llm.hf.made_up", "references.hash.made_up", "budget.made_up"])
def test_a_made_up_key_is_rejected(tmp_path, key):
    assert key not in KEYS
    with pytest.raises(ConfigError, match=f"unknown key '{key}'"):
        load_config(write(tmp_path / "empty.yaml", ""), sets=[f"{key}=1"])


def test_every_listed_key_has_a_doc():
    assert [k.key for k in LISTED if not k.doc.strip()] == []


def test_listed_types_choices_and_ranges_read_as_written():
    keys = {k.key: k for k in LISTED}
    assert (keys["batch_size"].type, keys["batch_size"].allowed, keys["batch_size"].default) == ("int", "1..16", "4")
    assert (keys["llm.hf.cache_dir"].type, keys["llm.hf.cache_dir"].default) == ("str | None", "null")
    assert keys["llm.backend"].allowed == "hf, openai, vllm" and keys["task"].allowed == "1, 2, 3"
    assert keys["attributes.dynamic_classes"].type == "list[str]"
    assert keys["attributes.dynamic_classes"].default == "[real-time, fast-changing]"
    assert keys["kg.retries"].allowed == "at least 0" and keys["r2ag.threshold"].allowed == "0..1"
    assert keys["llm.vllm.kv_cache_dtype"].default == "auto" and keys["prompts"].default == "{}"
    assert "docs/decisions/kg-reply-cap.md" in keys["kg.max_reply_bytes"].doc
    assert keys["embedder.max_seq_length"].allowed == "at least 1"  # a range on an optional key
    assert keys["references.retriever"].allowed.split(", ")[:2] == ["dense", "hash"]  # a registry's names
    # pydantic leaves out a field's doc that equals its section class's doc; the reference shows it all the same
    assert keys["reasoning"].doc == "The final answer prompt."


@pytest.mark.parametrize("path", BASES, ids=lambda p: p.name)
def test_shipped_configs_set_no_key_to_its_default(path):
    assert restated_defaults(path) == []


@pytest.mark.parametrize("path", OVERLAYS, ids=lambda p: p.name)
def test_shipped_overlays_set_no_key_to_its_default_unless_restoring_it(path):
    assert restated_defaults(path, overlay=True) == []


@pytest.mark.parametrize("text, overlay, found", [
    ("kg:\n  retries: 2\n", False, ["c.yaml: kg.retries = 2 (the default)"]),
    ("budget:\n  per_query_s: 30\n", False, ["c.yaml: budget.per_query_s = 30 (the default)"]),
    ("budget:\n  stage_share: {references: 0.4, kg: 0.2, knowledge: 0.2, calculator: 0.25}\n", False,
     ["c.yaml: budget.stage_share = {references: 0.4, kg: 0.2, knowledge: 0.2, calculator: 0.25} (the default)"]),
    ("strategies:\n  hanrag: [attributes, kg, precheck, references, r2ag, evidence, hanrag]\n", False,
     ["c.yaml: strategies = {hanrag: [attributes, kg, precheck, references, r2ag, evidence, hanrag]} (the default)"]),
    ("prompts: {}\nllm:\n  hf:\n    cache_dir: null\n", False,
     ["c.yaml: prompts = {} (the default)", "c.yaml: llm.hf.cache_dir = null (the default)"]),
    ("llm:\n  profile: configs/models/smollm2.yaml\n", False, []),  # a config names its model
    ("batch_size: 8\nkg:\n  retries: 5\n", False, []),
    ("task: 1\n", True, []),  # an overlay may restore a default a shipped config changes (task: 2)
    ("kg:\n  retries: 2\n", True, ["c.yaml: kg.retries = 2 (the default)"]),  # no shipped config changes it
])
def test_a_restated_default_is_found(tmp_path, text, overlay, found):
    assert restated_defaults(write(tmp_path / "c.yaml", text), overlay=overlay) == found
