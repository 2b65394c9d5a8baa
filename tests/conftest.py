from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from loguru import logger

from models.config import REPO_ROOT, SystemConfig
from models.gate.answer_gate import gate_settings
from models.kg.client import KGClient
from models.kg.settings import KGSettings
from models.loading import load_config
from models.state import OPEN_READS, OPEN_WRITES, PortError, Ports
from models.system import CragSystem
from tests.fakes import HashEmbedder, ScriptedLLM
from utils.batch import make_batch

SAMPLE = REPO_ROOT / "data" / "crag_sample.jsonl"
SHARED_CRAG = REPO_ROOT.parent / "shared" / "crag_sample" / "crag_public_sample_5.jsonl.bz2"

# The first lines of a script a Ctrl-C test runs: SIGINT handled as in a terminal's foreground job. A test run started
# in the background by a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored, and so would the
# script: the evaluation then never sees the test's Ctrl-C (a fresh-clone `.ci/run` started that way failed twice).
AS_FROM_A_TERMINAL = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


# Every (stage, field, write) a guarded state was asked for in this process: `--check-ports` checks, once the whole
# suite has run, that each built-in stage's declarations were all used.
TOUCHED: set[tuple[str, str, bool]] = set()


@pytest.fixture(autouse=True)
def declared_ports(request, monkeypatch):
    """Every stage a test runs touches only the fields it declares: an undeclared read or write fails the test even
    where the stage runner turns it into one query's "i don't know", which the test may never look at. A test of the
    refusal itself is marked `undeclared`."""
    refused: list[str] = []
    check = Ports.check

    def recorded(self: Ports, name: str, write: bool) -> None:
        try:
            check(self, name, write)
        except PortError as err:
            refused.append(str(err))
            raise
        TOUCHED.add((self.owner, name, write))

    monkeypatch.setattr(Ports, "check", recorded)
    yield
    if "undeclared" not in request.keywords:
        assert not refused, f"a stage touched fields it does not declare: {sorted(set(refused))}"


def pytest_addoption(parser):
    parser.addoption("--check-ports", action="store_true",
                     help="after the run, fail where a built-in stage declares a field its code never touched in it")


def pytest_configure(config):
    if config.getoption("--check-ports") and not hasattr(config, "workerinput"):
        os.environ["CRAG_PORTS_TOUCHED"] = tempfile.mkdtemp(prefix="ports-")  # the xdist workers inherit it


def pytest_sessionfinish(session, exitstatus):
    folder = os.environ.get("CRAG_PORTS_TOUCHED")
    if not session.config.getoption("--check-ports") or not folder:
        return
    if hasattr(session.config, "workerinput"):
        name = session.config.workerinput["workerid"]
        Path(folder, f"{name}.json").write_text(json.dumps(sorted(TOUCHED)), encoding="utf-8")
        return
    touched = set(TOUCHED)
    for path in Path(folder).glob("*.json"):
        touched |= {tuple(item) for item in json.loads(path.read_text(encoding="utf-8"))}
    shutil.rmtree(folder, ignore_errors=True)
    unused = unused_declarations(touched)
    if unused:
        session.config.get_terminal_writer().line(
            "declared but never touched by the stage's code in this run (tests/conftest.py --check-ports): "
            + "; ".join(unused), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def unused_declarations(touched: set[tuple[str, str, bool]]) -> list[str]:
    """Each built-in stage's declared read (`reads`, `may_read`) and write of a guarded field that `touched` lacks."""
    from models.loading import STAGE_MODULES, STAGES
    from models.stages.answer import AnswerStage

    stages = [cls for cls in map(STAGES.get, STAGES) if cls.__module__ in STAGE_MODULES] + [AnswerStage]
    unused = [f"{cls.name} reads {name}" for cls in stages for name in sorted((cls.reads | cls.may_read) - OPEN_READS)
              if (cls.name, name, False) not in touched]
    return unused + [f"{cls.name} writes {name}" for cls in stages for name in sorted(cls.writes - OPEN_WRITES)
                     if (cls.name, name, True) not in touched]


def to_batch(examples: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return make_batch(examples)


def stage_of(system: Any, name: str) -> Any:
    """The pipeline's stage of that name (a test that runs one stage on its own)."""
    return next(stage for stage in system.pipeline if stage.name == name)


@pytest.fixture
def sample_examples() -> list[dict[str, Any]]:
    return [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def cpu_config(tmp_path):
    """configs/cpu.yaml with pages processed in this process and cached under the test's tmp_path, and only
    references and reasoning on: task 1, so no KG (tests of the other stages turn theirs on). The answer gate is
    off: it reads log-probabilities the scripted LLM does not give (tests/unit/test_gate.py turns one on). The
    reasoning prompt is on, at its default length: cpu.yaml turns it off for SmolLM2, which all but never fills its
    answer block, but a larger model answers through it, and the scripted replies are written for it. For the same
    reason the KG stage, where a test turns it on, has the LLM name the entities (`kg.method`'s default), not
    cpu.yaml's question spans."""
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    gate_settings(config).gate = None
    config.reasoning.max_tokens = SystemConfig().reasoning.max_tokens
    config.section("kg", KGSettings).method = KGSettings().method
    config.attributes.method = "none"
    config.task = 1
    config.knowledge.enabled = False
    config.calculator.enabled = False
    config.references.workers = 1
    config.references.cache_dir = str(tmp_path / "cache")
    return config


@pytest.fixture
def make_system(cpu_config):
    """A CragSystem over the scripted LLM, the hashing embedder and, when given, a KG client; closed after the
    test."""
    systems: list[CragSystem] = []

    def build(llm: ScriptedLLM | None = None, kg: KGClient | None = None, **budget: float) -> CragSystem:
        for key, value in budget.items():
            setattr(cpu_config.budget, key, value)
        systems.append(CragSystem(cpu_config, llm=llm or ScriptedLLM(), embedder=HashEmbedder(), given={"kg": kg}))
        return systems[-1]

    yield build
    for system in systems:
        system.close()


@dataclass
class LogCapture:
    messages: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.messages)


@pytest.fixture
def caplog_loguru():
    """What the code logged through loguru during the test (level WARNING and above)."""
    capture = LogCapture()
    handler = logger.add(lambda message: capture.messages.append(str(message)), level="WARNING")
    yield capture
    logger.remove(handler)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def write_config(path: Path, changes: dict[str, Any], base: Path = REPO_ROOT / "configs" / "cpu.yaml") -> Path:
    """`base` with `changes` merged in key by key (as an --overlay is), written to `path`."""
    def merged(tree: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        return tree | {k: merged(tree.get(k) or {}, v) if isinstance(v, dict) else v for k, v in extra.items()}

    path.write_text(yaml.safe_dump(merged(yaml.safe_load(base.read_text(encoding="utf-8")) or {}, changes)),
                    encoding="utf-8")
    return path


def running(pid: int) -> bool:
    """Whether `pid` runs, from /proc (Linux): a zombie, dead and not yet reaped by whoever adopted it, does not."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return "State:\tZ" not in status.read()
    except FileNotFoundError:
        return False
