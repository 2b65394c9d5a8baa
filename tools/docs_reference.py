"""The docs site's generated reference pages (an MkDocs hook, mkdocs.yml `hooks`): every config key the loader
accepts, from the config dataclasses, every command's `--help` as a user sees it, and every stage's
declarations. Generated at each build, so the reference cannot drift from the code."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import sys
from pathlib import Path
from unittest import mock

from models.config import REPO_ROOT
from models.loading import config_keys
from models.stages import Stage

HELP_COLUMNS = "100"  # argparse wraps --help at $COLUMNS; fixed, so the page does not depend on the terminal
# argparse's usage of subcommands, `{run,rejudge,...} ...`; not an option's choices, `--method {a,b} [{a,b} ...]`
SUBCOMMANDS = re.compile(r"(?<![\[\w-])\{([\w,-]+)\} \.\.\.(?!\])")
MAIN = re.compile(r"^if __name__ == .__main__.:", re.MULTILINE)  # a script, not a module of helpers


def programs() -> list[list[str]]:
    """The argv (after `python`) of every command a user runs: local_evaluation.py, each script in tools/ and each
    benchmark module."""
    def scripts(folder: str) -> list[Path]:
        return [p for p in sorted((REPO_ROOT / folder).glob("*.py")) if MAIN.search(p.read_text(encoding="utf-8"))]

    return [["local_evaluation.py"], *([f"tools/{p.name}"] for p in scripts("tools")),
            *(["-m", f"benchmarks.{p.stem}"] for p in scripts("benchmarks"))]


def help_text(argv: list[str]) -> str:
    """`python ARGV --help` as a user sees it: the program's main() called in this process (its imports are paid
    once for every page and test), with argparse's program name and width as from a terminal in the repository."""
    module = argv[1] if argv[0] == "-m" else Path(argv[0]).with_suffix("").as_posix().replace("/", ".")
    main = importlib.import_module(module).main
    path = REPO_ROOT / (f"{module.replace('.', '/')}.py")
    printed = io.StringIO()
    try:
        with (mock.patch.object(sys, "argv", [str(path)]), mock.patch.dict(os.environ, COLUMNS=HELP_COLUMNS),
              contextlib.redirect_stdout(printed)):
            main([*argv[2 if argv[0] == "-m" else 1:], "--help"])
        raise RuntimeError(f"python {' '.join(argv)} --help returned instead of printing its help and exiting")
    except SystemExit as done:
        if done.code not in (0, None):
            raise RuntimeError(f"python {' '.join(argv)} --help exited {done.code}") from None
    return printed.getvalue()


def help_tree(argv: list[str]) -> list[tuple[list[str], str]]:
    """`argv`'s --help, then each of its subcommands' (argparse's `{a,b} ...` in the usage), depth first."""
    text = help_text(argv)
    found = SUBCOMMANDS.search(text.split("\n\n", 1)[0])
    tree = [(argv, text)]
    for choice in found.group(1).split(",") if found else ():
        tree += help_tree([*argv, choice])
    return tree


def commands_page() -> str:
    trees = [help_tree(argv) for argv in programs()]
    parts = ["# Commands\n", "Every command's `--help`, generated from the code at each docs build (`make docs`). "
             "Run them from the repository root with `.venv/bin/python` (after `make setup`), or as `python` with "
             "`.venv` activated.\n"]
    for tree in trees:
        for argv, text in tree:
            parts.append(f"## `python {' '.join(argv)}`\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_page() -> str:
    def code(text: str) -> str:
        return f"`{_cell(text)}`" if text else ""

    rows = [f"| `{key.key}` | {code(key.type)} | {code(key.default)} | {_cell(key.allowed)} | {_cell(key.doc)} |"
            for key in config_keys()]
    return "\n".join([
        "# Configuration keys\n",
        "Every key a config file, an `--overlay` or `--set KEY=VALUE` accepts, with its type, its default (the "
        "dataclasses in `models/config/` are the base every config file changes) and what it does. Generated "
        "from the code at each docs build. A key that is not here is an error.\n",
        "| key | type | default | allowed | what it does |", "|---|---|---|---|---|", *rows, ""])


def stages_page() -> str:
    """Every registered stage's declarations, and the answer step's, as the code declares them."""
    from models.loading import STAGES
    from models.stages.answer import AnswerStage

    def names(values) -> str:
        return ", ".join(f"`{v}`" for v in sorted(values)) or "-"

    classes = [STAGES.get(name) for name in sorted(STAGES)] + [AnswerStage]
    def estimates(cls: type[Stage]) -> str:
        overridden = getattr(cls.estimate, "__func__", None) is not getattr(Stage.estimate, "__func__", None)
        return "yes" if overridden else "-"

    def evidence(cls: type[Stage]) -> str:
        blocks = [f"`{spec.name}`: {spec.evidence.title}" for spec in cls.fields if spec.evidence is not None]
        return "; ".join(blocks) or "-"

    rows = [f"| `{cls.name}` | `{cls.__module__}` | {names(cls.prompts)} | {names(cls.sections)} | {names(cls.reads)} "
            f"| {names(cls.may_read)} | {names(cls.writes)} | {evidence(cls)} | {names(cls.needs)} | {estimates(cls)} |"
            for cls in classes]
    signals = [f"| `{name}` | `{cls.name}` | {_cell(meaning)} |"
               for cls in classes for name, meaning in sorted(cls.signals.items())]
    return "\n".join([
        "# Stages\n",
        "Every stage the code registers, and the answer step that closes every strategy, with what each declares "
        "(`models/stages/stage.py` `Stage`; [Stages and strategies](../concepts/stages.md)). Generated from the code "
        "at each docs build.\n",
        "| stage | module | prompts | config sections | reads | may read | writes | evidence | resources "
        "| budget estimate |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        "## Signals\n",
        "The answer gate's inputs, by the stage that writes each (`Stage.signals`).\n",
        "| signal | stage | what it is |", "|---|---|---|", *signals, ""])


def on_files(files, config):  # noqa: ANN001, ANN201 - MkDocs' hook signature (mkdocs.plugins.BasePlugin.on_files)
    """Add the generated pages to the site (MkDocs 1.6 `File.generated`)."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, "reference/config.md", content=config_page()))
    files.append(File.generated(config, "reference/commands.md", content=commands_page()))
    files.append(File.generated(config, "reference/stages.md", content=stages_page()))
    return files
