"""The gate sets, and how a benchmark answers them: the two question sets disjoint from data/crag_sample.jsonl that
the answer gate is fit on (benchmarks/gate.py) and the fine-tuned model is cross-fit on (benchmarks/finetune.py),
answered by the embedded default as `make eval` serves it (configs/cpu.yaml with configs/overlays/vllm-cpu.yaml,
`--serve-llm`, the fixture KG server) with its gate off."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from evaluation import manifest
from evaluation.choices import Answering, ConfigChoice, JudgeChoice, RunFolder
from evaluation.rejudge_command import rejudge
from evaluation.run_command import run
from evaluation.runner import load_predictions
from models.config import REPO_ROOT
from models.llm.weights import weights_of
from utils.trees import differences

SETS = {"gate-dev": REPO_ROOT / "data" / "gate_dev.jsonl",
        "gate-kg": REPO_ROOT / "benchmarks" / "kg_reach" / "questions.jsonl"}
# A person's verdicts on the served SmolLM2's sentence answers to both sets ({query, prediction, human} lines).
VERDICTS = REPO_ROOT / "data" / "gate_dev" / "verdicts.jsonl"
PERSON = f"person:{VERDICTS}"
SERVED = REPO_ROOT / "configs" / "overlays" / "vllm-cpu.yaml"
ANSWERING = Answering(restart=True, serve_kg=True, log_level="ERROR", serve_llm=True)


def ungated(*sets: str) -> ConfigChoice:
    """The served embedded default with its gate off, and `sets` (KEY=VALUE) on top."""
    return ConfigChoice(REPO_ROOT / "configs" / "cpu.yaml", overlays=(SERVED,), sets=("answer.gate=null", *sets))


def quiet_run(folder: RunFolder, answering: Answering | None) -> float:
    """Seconds of answering `folder` with `answering`, or of rejudging it where `answering` is None, its report not
    printed; SystemExit with the end of what it printed when it exits non-zero."""
    started = time.perf_counter()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = run(folder, answering) if answering is not None else rejudge(folder)
    if code != 0:
        raise SystemExit(f"error: the run of {folder.data} into {folder.out} exited {code}:\n"
                         f"{printed.getvalue()[-2000:]}")
    return time.perf_counter() - started


def answer_set(data: Path, out: Path, judge: str = PERSON, answer: bool = True, record_prompts: bool = False,
               sets: tuple[str, ...] = ()) -> float:
    """Seconds of one ungated run of `data` into `out` with `sets` on top, or of its rejudging by `judge` when not
    `answer`. Every answer is kept, judged or not. `record_prompts`: the records keep every conversation (what
    `tools/train_llm.py data` builds training data from)."""
    folder = RunFolder(data, ungated(*sets), out, judge=JudgeChoice(judge), max_unjudged=10 ** 9)
    seconds = quiet_run(folder, replace(ANSWERING, record_prompts=record_prompts) if answer else None)
    late = past_their_limit(out)
    if late:  # the run logs only errors: say it here, as these answers are declines the model did not choose
        print(f"warning: {late} of {data}'s questions were in batches stopped at their time limit and count as "
              f"\"i don't know\" ({out})", file=sys.stderr)
    return seconds


def past_their_limit(out: Path) -> int:
    """How many of a run folder's questions were in a batch stopped at its time limit."""
    return sum(bool(record.get("timed_out")) for record in load_predictions(out / "predictions.jsonl").values())


def check_weights(config: ConfigChoice, out: Path) -> None:
    """SystemExit unless the run folder's answers came from the weights `config` runs now (models/llm/weights.py):
    a kept run of another model is answered again, never taken as this one's."""
    found = manifest.load(out) or {}
    recorded = (found.get("answers") or {}).get("weights")
    current = weights_of(json.loads(json.dumps(config.load().resolved()))["llm"])
    if recorded != current:
        raise SystemExit(f"error: {out} was answered by other weights than the config runs now "
                         f"({'; '.join(differences(recorded, current)) or 'none recorded'}); answer it again "
                         "(leave out --reuse)")
