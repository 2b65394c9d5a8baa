"""The grader's loop (tools/rehearse.py) over data/crag_sample.jsonl: UserModel built from $CRAG_CONFIG, the T4
config with the weights swapped for SmolLM2 and MiniLM, on the real engine, the fixture KG behind the KG stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from models.loading import load_config, pipeline_stages
from tests.vllm.conftest import REPO
from tests.vllm.test_submission import T4

SAMPLE = REPO / "data" / "crag_sample.jsonl"


def rehearse(*args: str, script: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *(script or [str(REPO / "tools" / "rehearse.py")]), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=900, env={**os.environ})


# The T4 config with its reasoning prompt off, as configs/cpu.yaml answers with SmolLM2, which all but never writes that
# prompt's answer block: on two CPU cores its 384 tokens for eight questions take a batch's whole limit, and whether
# the backup summariser then answers or is cut by the deadline turns on seconds. The structured prompt meets the
# real engine in test_serve.py (the single-GPU config).
SUMMARISER_ONLY = ("--set", "reasoning.max_tokens=0")


@pytest.fixture(scope="module")
def rehearsal(smollm2, tmp_path_factory):
    out = tmp_path_factory.mktemp("rehearsal")
    result = rehearse("--cpu-model", str(smollm2), "--serve-kg", *SUMMARISER_ONLY, "--out", str(out))
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else None
    records = [json.loads(line) for line in (out / "predictions.jsonl").open()] if summary else []
    return result, summary, records


def test_every_answer_is_a_string_within_the_grader_s_limits(rehearsal):
    result, summary, records = rehearsal
    assert result.returncode == 0 and summary["problems"] == [], result.stderr[-3000:]
    assert summary["questions"] == len(records) == sum(1 for _ in SAMPLE.open())
    assert all(isinstance(r["prediction"], str) and r["grader_tokens"] <= 75 for r in records)
    batch_size = load_config(T4).batch_size
    assert summary["batch_sizes"] == [batch_size] * (len(records) // batch_size) + (
        [len(records) % batch_size] if len(records) % batch_size else [])


def test_the_trace_shows_the_engine_and_the_configured_stages(rehearsal):
    _, summary, records = rehearsal
    assert summary["backend"] == "vllm"
    configured = [stage.name for stage in pipeline_stages(load_config(T4))]
    assert list(summary["stages"]) == [*configured, "answer"]
    assert summary["stages"]["reasoning"].get("ok", 0) > len(records) / 2


def test_some_answers_are_not_i_don_t_know(rehearsal):
    _, summary, records = rehearsal
    assert summary["answered"] >= 1
    assert summary["answered"] == sum(r["prediction"] != "i don't know" for r in records)


UNGUARDED = """
    import sys
    sys.path.insert(0, {repo!r})
    from tools.rehearse import main
    main({args!r})
"""


def test_a_script_without_a_main_guard_cannot_start_the_engine(smollm2, tmp_path):
    """The engine core is a spawned process, which re-imports the calling script: the grader's script guards its
    main section, and one that does not fails at start-up with multiprocessing's own error."""
    two = tmp_path / "two.jsonl"
    two.write_text("".join(SAMPLE.read_text().splitlines(keepends=True)[:2]))
    script = tmp_path / "unguarded.py"
    args = ["--data", str(two), "--cpu-model", str(smollm2), "--out", str(tmp_path / "out"), "--set",
            "batch_size=2", "--set", "llm.vllm.enforce_eager=true"]
    script.write_text(textwrap.dedent(UNGUARDED.format(repo=str(REPO), args=args)))
    result = rehearse(script=[str(script)])
    assert result.returncode != 0
    assert "bootstrapping phase" in result.stderr and "Engine core initialization failed" in result.stderr
