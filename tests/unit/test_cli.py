"""utils.cli: every console script turns a HarnessError into one line and exit 2, through one wrapper."""

from __future__ import annotations

import importlib
import tomllib

import pytest

from models.config import REPO_ROOT
from utils.cli import USAGE_ERROR, command
from utils.errors import ConfigError, HarnessError


def test_a_harness_error_is_one_line_and_exit_2(capsys):
    @command
    def main(argv: list[str]) -> int:
        raise ConfigError(f"--limit {argv[0]}: give a positive number")

    assert main(["-3"]) == USAGE_ERROR == 2
    assert capsys.readouterr().err == "error: --limit -3: give a positive number\n"


def test_other_errors_are_not_swallowed():
    @command
    def main() -> int:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        main()


SCRIPTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_console_script_goes_through_the_wrapper(name):
    module, _, function = SCRIPTS[name].partition(":")
    main = getattr(importlib.import_module(module), function)
    assert main.__code__ is command(main).__code__, f"{name} ({SCRIPTS[name]}): decorate it with utils.cli.command"


def test_the_user_facing_errors_share_the_root():
    from evaluation.data import DataError
    from evaluation.runner import EvaluationError
    from evaluation.worker import WorkerError
    from models.gate.answer_gate import GateError
    from models.llm.backend import BackendUnavailable
    from models.prompting import PromptError

    for error in (ConfigError, DataError, EvaluationError, WorkerError, GateError, BackendUnavailable, PromptError):
        assert issubclass(error, HarnessError), error
