"""The docs cannot drift from the code: every command the README and docs/ show runs with --help and knows every flag
shown with it, every make target they name exists, and the generated reference pages cover every config key and
every command."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from models.config import REPO_ROOT
from models.loading import config_keys
from tools import docs_reference

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
PYTHONS = re.compile(r"^(?:\.venv(?:-quantize|-vllm)?/bin/)?python3?$")


def shown_commands(text: str) -> list[str]:
    """The commands of a page's ```sh blocks, continuation lines joined, comments left out."""
    commands = []
    for block in SH_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                commands.append(" ".join(line.split(" #")[0].split()))
    return commands


def program_of(words: list[str]) -> list[str] | None:
    """The argv after `python` that a shown command runs (a script or a benchmark module); None for anything else
    (make, vllm serve, pip, git, cd, export: checked elsewhere or not ours)."""
    if not words or not PYTHONS.match(words[0]):
        return None
    if words[1:2] == ["-m"]:
        return words[1:3] if words[2].startswith("benchmarks.") else None
    return words[1:2] if words[1].endswith(".py") else None


def test_shown_commands_parse_as_the_test_reads_them():
    text = ("```sh\n# a comment\npython local_evaluation.py compare A B \\\n  --show 3\nmake eval\n```\n"
            "```text\npython not_a_command.py\n```\n")
    assert shown_commands(text) == ["python local_evaluation.py compare A B --show 3", "make eval"]
    assert program_of(["python", "-m", "benchmarks.gate", "--reuse"]) == ["-m", "benchmarks.gate"]
    assert program_of([".venv-quantize/bin/python", "tools/quantize.py", "gptq"]) == ["tools/quantize.py"]
    assert program_of(["vllm", "serve", "x"]) is None


def _shown() -> list[tuple[Path, str]]:
    return [(page, command) for page in PAGES for command in shown_commands(page.read_text(encoding="utf-8"))]


def test_the_docs_show_commands():
    programs = {tuple(program_of(shlex.split(c)) or ()) for _, c in _shown()}
    assert ("local_evaluation.py",) in programs and len(programs) > 5


def test_every_make_target_shown_exists():
    targets = set(re.findall(r"^([\w-]+):", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE))
    for page, command in _shown():
        words = shlex.split(command)
        if words[0] == "make":
            missing = [w for w in words[1:] if "=" not in w and not w.startswith("-") and w not in targets]
            assert not missing, f"{page.relative_to(REPO_ROOT)}: `{command}` names no make target {missing}"


def test_every_command_shown_runs_with_help_and_knows_its_flags():
    shown = [(page, command, shlex.split(command)) for page, command in _shown()]
    programs = sorted({tuple(p) for *_, words in shown if (p := program_of(words))})
    helps = {tuple(argv): text for program in programs for argv, text in docs_reference.help_tree(list(program))}
    for page, command, words in shown:
        program = program_of(words)
        if program is None:
            continue
        argv, rest = list(program), words[1 + len(program):]
        while rest and tuple([*argv, rest[0]]) in helps:  # the subcommands: `gate fit`, `quantize.py gptq`
            argv.append(rest.pop(0))
        text = helps[tuple(argv)]
        flags = {w.split("=")[0] for w in rest if w.startswith("--")}
        unknown = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text))
        assert not unknown, f"{page.relative_to(REPO_ROOT)}: `{command}`: {' '.join(argv)} has no {unknown}"


def test_the_config_reference_lists_every_key():
    page = docs_reference.config_page()
    assert all(f"| `{key.key}` |" in page for key in config_keys())


@pytest.mark.parametrize("argv", [["local_evaluation.py"], ["tools/quantize.py"]])
def test_the_commands_reference_covers_each_subcommand(argv):
    tree = docs_reference.help_tree(argv)
    assert len(tree) > 4 and all(text.startswith("usage:") for _, text in tree)
