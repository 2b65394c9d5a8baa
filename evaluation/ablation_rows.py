"""The rows of `local_evaluation.py ablate` (evaluation/ablation.py): a variant's edits (-STAGE, +STAGE, KEY=VALUE) as
--set assignments over the config, each row's config loaded and its pipeline checked before anything runs, so that
a bad variant is a one-line error naming it."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.config import DEFAULT_STRATEGIES, ConfigError, SystemConfig
from models.loading import pipeline_stages
from models.stages import STAGES
from utils.names import did_you_mean

NO_GATE = "answer.gate=null"
FULL = "full system"
BASE = "base"
EDIT = re.compile(r"^(?P<sign>[+-])(?P<stage>[A-Za-z_][\w]*)$")


@dataclass(frozen=True)
class Variant:
    """One row: its name, the edits as given and the --set assignments they come to over the base config."""

    name: str
    edits: tuple[str, ...]
    sets: tuple[str, ...]
    config: SystemConfig = field(compare=False, repr=False)

    @property
    def slug(self) -> str:
        """Its name as the start of a folder's name."""
        return re.sub(r"[^A-Za-z0-9]+", "-", self.name).strip("-").lower()[:40] or "row"


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`NAME: EDIT EDIT ...` (or the edits alone, named by themselves) as (name, edits); edits split as a shell
    splits words, so a value with spaces is quoted."""
    name, sep, rest = text.partition(":")
    if not sep or "=" in name or name.strip().startswith(("+", "-")):
        name, rest = text, text
    try:
        edits = shlex.split(rest)
    except ValueError as err:
        raise ConfigError(f"--variant {text!r}: {err}; quote a value with spaces once") from None
    if not edits:
        raise ConfigError(f"--variant {text!r}: no edit; give -STAGE, +STAGE or KEY=VALUE after the name")
    return name.strip(), edits


def read_variants(path: Path) -> list[str]:
    """A variants file: a YAML list, each item `NAME: EDITS` (a string) or {name: EDITS} (a one-key mapping)."""
    import yaml

    try:
        items = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--variants {path}: unreadable ({err})") from None
    if not isinstance(items, list) or not items:
        raise ConfigError(f"--variants {path}: write a YAML list of 'NAME: EDITS' lines")
    texts = []
    for number, item in enumerate(items, start=1):
        if isinstance(item, dict) and len(item) == 1:
            (name, edits), = item.items()
            edits = " ".join(edits) if isinstance(edits, list) else edits
            texts.append(f"{name}: {edits}")
        elif isinstance(item, str):
            texts.append(item)
        else:
            raise ConfigError(f"--variants {path}: item {number} is neither 'NAME: EDITS' nor a one-key mapping")
    return texts


def _strategy_set(config: SystemConfig, names: list[str]) -> str:
    return f"strategies.{config.strategy}=[{', '.join(names)}]"


def _assigns(edit: str) -> bool:
    """Whether `edit` is KEY=VALUE (else -STAGE or +STAGE)."""
    return "=" in edit and not edit.startswith(("+", "-"))


def edit_sets(edit: str, config: SystemConfig, label: str) -> list[str]:
    """The --set assignments of one edit on `config`; a ConfigError (naming `label`, the variant) where it names no
    stage, or turns off a stage that is not on, or on one that is."""
    if _assigns(edit):
        return [edit]
    match = EDIT.match(edit)
    if match is None:
        raise ConfigError(f"{label}: {edit!r} is no edit; write -STAGE, +STAGE or KEY=VALUE")
    stage, listed = match["stage"], config.strategy_names()
    on = [cls.name for cls in pipeline_stages(config)]
    if stage not in STAGES or STAGES.get(stage).closing:
        raise ConfigError(f"{label}: {edit}: no stage {stage!r} can be listed in a strategy"
                          f"{did_you_mean(stage, [n for n in STAGES if not STAGES.get(n).closing])}")
    cls = STAGES.get(stage)
    if match["sign"] == "-":
        if stage not in on:
            why = "is not in" if stage not in listed else "is switched off in"
            raise ConfigError(f"{label}: {edit}: stage {stage} {why} strategy {config.strategy} "
                              f"(it runs: {', '.join(on)}); the row would be the one it is set against")
        return [_strategy_set(config, [name for name in listed if name != stage])]
    if stage in on:
        raise ConfigError(f"{label}: {edit}: stage {stage} already runs in strategy {config.strategy}")
    sets: list[str] = []
    if stage not in listed:
        sets.append(_strategy_set(config, _placed(stage, listed, label, edit)))
    if not cls.active(config):
        if not cls.switch_on:
            raise ConfigError(f"{label}: {edit}: stage {stage} is switched off by a setting it does not name; give "
                              "the setting that turns it on as KEY=VALUE")
        sets.extend(cls.switch_on)
    return sets


def _placed(stage: str, listed: list[str], label: str, edit: str) -> list[str]:
    """`listed` with `stage` inserted where the seed system's strategy puts it, after the listed stages before it."""
    order = DEFAULT_STRATEGIES["hybrid"]
    if stage not in order:
        raise ConfigError(f"{label}: {edit}: stage {stage} has no place in the seed system's order "
                          f"({', '.join(order)}); swap the strategy (strategy=NAME) or list it with "
                          f"strategies.NAME=[...]")
    before = set(order[:order.index(stage)])
    at = max((i + 1 for i, name in enumerate(listed) if name in before), default=0)
    return [*listed[:at], stage, *listed[at:]]


def build_variants(texts: Sequence[str], load: Callable[[Sequence[str]], SystemConfig], incremental: bool,
                   serve_llm: bool = False) -> list[Variant]:
    """The rows: the config itself, then one per variant text; each config loaded (`load(sets)`) and its pipeline
    checked before anything runs, so that an unknown setting or a stage left without a field it reads is a
    one-line error naming the variant."""
    base = load([NO_GATE])
    pipeline_stages(base)
    rows = [Variant(BASE if incremental else FULL, (), (), base)]
    for text in texts:
        name, edits = parse_variant(text)
        label = f"--variant {name!r}"
        if name in {row.name for row in rows}:
            raise ConfigError(f"{label}: another row has that name; name each variant once")
        previous = rows[-1] if incremental else rows[0]
        # the settings together first (one may need another: retriever hash and its model), then each stage edit,
        # which then loads with them (`+r2ag r2ag.checkpoint=FILE`)
        assigned = [edit for edit in edits if _assigns(edit)]
        sets, config = [*previous.sets, *assigned], previous.config
        steps = ([" ".join(assigned)] if assigned else []) + [edit for edit in edits if not _assigns(edit)]
        for edit in steps:
            if not _assigns(edit):
                sets += edit_sets(edit, config, label)
            config = _load(load, sets, label)
            try:
                runs = {cls.name for cls in pipeline_stages(config)}
            except ConfigError as err:
                raise ConfigError(f"{label}: {err}") from None
            if (match := EDIT.match(edit)) and (match["stage"] in runs) != (match["sign"] == "+"):
                raise ConfigError(f"{label}: {edit}: stage {match['stage']} is still "
                                  f"{'off' if match['sign'] == '+' else 'on'} after it; set what else it needs "
                                  "(its `active` reads more settings)")
        if serve_llm and config.resolved()["llm"] != base.resolved()["llm"]:
            raise ConfigError(f"{label}: --serve-llm serves the config's model and engine settings to every row; "
                              "vary llm.* without --serve-llm, against a server of your own per setting")
        if _settings(config) == _settings(previous.config):
            raise ConfigError(f"{label}: {' '.join(edits)} changes no setting of the row it is set against")
        rows.append(Variant(name, tuple(edits), tuple(sets), config))
    return rows


def _settings(config: SystemConfig) -> dict[str, Any]:
    return {key: value for key, value in config.resolved().items() if key != "source"}


def _load(load: Callable[[Sequence[str]], SystemConfig], sets: Sequence[str], label: str) -> SystemConfig:
    try:
        return load([*sets, NO_GATE])
    except ConfigError as err:
        raise ConfigError(f"{label}: {err}") from None
