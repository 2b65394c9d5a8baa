"""Prompt files: prompts/<name>.yaml with `variables`, `system` and `user` Jinja2 templates."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import yaml

from models.config import REPO_ROOT
from models.state import ADDED_FIELDS, EVIDENCE, QueryState
from utils.errors import HarnessError

PROMPT_DIR = REPO_ROOT / "prompts"
_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False,
                          trim_blocks=True, lstrip_blocks=True, autoescape=False)


class PromptError(HarnessError, ValueError):
    """A prompt file that cannot be loaded or rendered; the message names the file."""


class Messages(list[dict[str, str]]):
    """A rendered prompt: its messages (a list of {"role", "content"}, what every backend takes) and `prompt`, the
    name of the prompt file it was rendered from, which the run's record keeps beside it ("" for messages built
    otherwise). What a stage sends through StageContext.generate."""

    def __init__(self, messages: Iterable[dict[str, str]], prompt: str = "") -> None:
        super().__init__(messages)
        self.prompt = prompt


@dataclass(frozen=True)
class Prompt:
    name: str
    path: Path
    variables: frozenset[str]
    system: jinja2.Template
    user: jinja2.Template

    def render(self, **values: Any) -> Messages:
        """Messages for the LLM; a declared variable left out is an error, never a blank."""
        missing = self.variables - values.keys()
        extra = values.keys() - self.variables
        if missing or extra:
            raise PromptError(f"{self.path}: render needs {sorted(self.variables)}; "
                              f"missing {sorted(missing)}, unexpected {sorted(extra)}")
        try:
            return Messages([{"role": "system", "content": self.system.render(**values).strip()},
                             {"role": "user", "content": self.user.render(**values).strip()}], self.name)
        except jinja2.UndefinedError as err:
            raise PromptError(f"{self.path}: {err}") from err


def load_prompt(path: Path, name: str | None = None) -> Prompt:
    """Parse and check one prompt file: templates may use only the variables it declares."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise PromptError(f"{path}: cannot read prompt file: {err}") from err
    if not isinstance(data, dict) or not {"system", "user", "variables"} <= data.keys():
        raise PromptError(f"{path}: a prompt file needs 'variables', 'system' and 'user'")
    declared = frozenset(data["variables"])
    templates = {}
    for part in ("system", "user"):
        try:
            used = jinja2.meta.find_undeclared_variables(_ENV.parse(data[part]))
            templates[part] = _ENV.from_string(data[part])
        except jinja2.TemplateSyntaxError as err:
            raise PromptError(f"{path}: {part} template, line {err.lineno}: {err.message}") from err
        if used - declared:
            raise PromptError(f"{path}: {part} template uses undeclared {sorted(used - declared)}")
    return Prompt(name or path.stem, path, declared, templates["system"], templates["user"])


def render_with_evidence(prompt: Prompt, state: QueryState, **values: Any) -> Messages:
    """`prompt` for `state`: `values`, and for each variable of the prompt left that names a field declaring
    `Evidence`, that block's lines (none where no stage wrote it: such a variable is optional); the variable
    `evidence`, where the prompt has it, lists every listed block it does not name (each with `title`, `kind`,
    `lines`). A block with lines that the prompt shows nowhere is added to `state.unshown`, so the record says what
    the LLM was not shown."""
    blocks = {block.name: block for block in state.evidence_blocks()}
    values = dict(values)
    for name in prompt.variables - values.keys():
        if name in ADDED_FIELDS and ADDED_FIELDS[name][1].evidence is not None:
            values[name] = blocks[name].lines if name in blocks else []
    listed = [block for name, block in blocks.items() if name not in values and block.listed]
    if EVIDENCE in prompt.variables and EVIDENCE not in values:
        values[EVIDENCE] = listed
    shown = {block.name for block in values.get(EVIDENCE, [])} | set(values)
    state.unshown += [f"{prompt.name}: {name}" for name in blocks if name not in shown]
    return prompt.render(**values)


class PromptLibrary:
    """Prompts by name; `overrides` maps a name to a variant file (relative paths from the repo root)."""

    def __init__(self, overrides: dict[str, str] | None = None, directory: Path = PROMPT_DIR) -> None:
        self._directory = directory
        self._overrides = overrides or {}
        self._cache: dict[str, Prompt] = {}

    def get(self, name: str) -> Prompt:
        if name not in self._cache:
            override = self._overrides.get(name)
            path = (REPO_ROOT / override) if override else self._directory / f"{name}.yaml"
            if not path.is_file():
                raise PromptError(f"{path}: prompt '{name}' not found")
            self._cache[name] = load_prompt(path, name)
        return self._cache[name]

    def hashes(self) -> dict[str, str]:
        """sha256 of the file behind every prompt this library serves (the shipped ones and the overrides), by
        name: what a run's manifest and a gate's setup record."""
        names = {path.stem for path in self._directory.glob("*.yaml")} | set(self._overrides)
        return {name: hashlib.sha256(self.get(name).path.read_bytes()).hexdigest() for name in sorted(names)}
