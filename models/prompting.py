"""Prompt files: prompts/<name>.yaml with `variables`, `system` and `user` Jinja2 templates."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import jinja2.lexer
import jinja2.meta
import yaml

from models.config import REPO_ROOT
from models.state import ADDED_FIELDS, EVIDENCE, QueryState
from utils.errors import HarnessError

PROMPT_DIR = REPO_ROOT / "prompts"
_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False,
                          trim_blocks=True, lstrip_blocks=True, autoescape=False)


class _Empty:
    """A variable left empty, whatever its type: it renders as "", is false, iterates and measures as nothing, and its
    attributes, items, calls (`outline.items()`) and sums (`references + tables`) are empty too."""

    def __str__(self) -> str:
        return ""

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __getattr__(self, name: str) -> _Empty:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __getitem__(self, key: Any) -> _Empty:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> _Empty:
        return self

    def __add__(self, other: Any) -> _Empty:
        return self

    __radd__ = __add__


DIGEST_PREFIX = "template-sha256:"
_FILE_SHA256 = re.compile(r"[0-9a-f]{64}")


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
    sources: tuple[str, str]  # the system and user templates' text

    @property
    def digest(self) -> str:
        """What the prompt is, as a run's manifest and a gate's setup record it: its variables and its templates'
        tokens, without comments and the spaces inside tags. An edit to a comment leaves it as it was; an edit to
        anything the prompt can render changes it."""
        tokens = [[(kind, value) for _, kind, value in _ENV.lex(source) if kind not in jinja2.lexer.ignored_tokens]
                  for source in self.sources]
        canonical = json.dumps({"variables": sorted(self.variables), "templates": tokens}, ensure_ascii=False)
        return DIGEST_PREFIX + hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def fixed_text(self) -> str:
        """The system and user messages rendered with every variable empty: the text every query's prompt holds,
        which the budget planner counts (models/estimates.py)."""
        empty = dict.fromkeys(self.variables, _Empty())
        return "\n".join(template.render(**empty).strip() for template in (self.system, self.user))

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
    return Prompt(name or path.stem, path, declared, templates["system"], templates["user"],
                  (data["system"], data["user"]))


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

    def digests(self) -> dict[str, str]:
        """`Prompt.digest` of every prompt this library serves (the shipped ones and the overrides), by name: what a
        run's manifest and a gate's setup record."""
        names = {path.stem for path in self._directory.glob("*.yaml")} | set(self._overrides)
        return {name: self.get(name).digest for name in sorted(names)}

    def upgrade(self, recorded: dict[str, Any]) -> dict[str, Any]:
        """`recorded` prompt identities (a manifest's, a gate's setup's) with each file sha256, which records made
        before digests hold, replaced by the digest of the prompt file with those bytes among the shipped prompts,
        their variants and this library's overrides. A record of an unchanged file then compares equal; one of a
        file changed since keeps its sha256, which no digest equals."""
        old = {value for value in recorded.values() if isinstance(value, str) and _FILE_SHA256.fullmatch(value)}
        if not old:
            return recorded
        paths = set(self._directory.rglob("*.yaml")) | {REPO_ROOT / path for path in self._overrides.values()
                                                         if isinstance(path, str)}
        by_bytes = {hashlib.sha256(path.read_bytes()).hexdigest(): path for path in paths if path.is_file()}
        return {name: load_prompt(by_bytes[value]).digest if value in old and value in by_bytes else value
                for name, value in recorded.items()}
