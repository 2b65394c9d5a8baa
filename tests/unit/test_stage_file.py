"""A stage is one file: tests/stages/answer_check.py adds settings, a QueryState field, a resource, a gate signal and
a budget estimate; tests/stages/page_dates.py adds settings, a field whose evidence reaches the reasoning prompt and
a gate signal. A config that names either in `stage_modules` loads it, in a fresh process, with no patching and no
other file changed. The how-to (docs/how-to/add-a-stage.md) follows these stages."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from models.config import REPO_ROOT
from models.prompting import load_prompt
from tests.conftest import SAMPLE
from tests.fakes import HashEmbedder

STAGE = "answer_check"
STAGE_FILE = REPO_ROOT / "tests" / "stages" / f"{STAGE}.py"
PROMPT_FILE = REPO_ROOT / "tests" / "stages" / f"{STAGE}.yaml"

# What the test runs in a fresh interpreter: the config names the stage, a CragSystem over the scripted LLM and the
# hashing embedder (given as arguments, as a test's fakes are) answers two sample questions.
DRIVER = """
import json, sys
from evaluation.choices import check_prompts
from models.loading import config_keys, load_config
from models.system import CragSystem
from tests.conftest import to_batch
from tests.fakes import SEED_REPLY, HashEmbedder, ScriptedLLM, prompt_name

config = load_config("configs/cpu.yaml", [sys.argv[1]])
check_prompts(config.prompts, config.source)  # as local_evaluation.py checks a config before any model loads
REPLY = SEED_REPLY.replace("paris", "science fiction")  # words of the first question's best reference
llm = ScriptedLLM(lambda c: sys.argv[3] if prompt_name(c) == "answer_check" else REPLY)
system = CragSystem(config, llm=llm, embedder=HashEmbedder())
examples = [json.loads(line) for line in open(sys.argv[2], encoding="utf-8")][:2]
result = system.answer_batch(to_batch(examples))
system.close()
print(json.dumps({"answers": result.answers, "records": result.trace, "pipeline": [s.name for s in system.pipeline],
                  "resources": sorted(system.resources), "settings": config.resolved()["answer_check"],
                  "keys": [k.key for k in config_keys()],
                  "shown": [c[-1]["content"].count("</reference>")
                            for calls, _ in llm.calls for c in calls if prompt_name(c) == "answer_check"]}))
"""


def overlay(tmp_path: Path, **settings) -> Path:
    path = tmp_path / "checked.yaml"
    path.write_text(yaml.safe_dump({
        "stage_modules": ["tests.stages.answer_check"],
        "task": 1, "attributes": {"method": "none"}, "answer": {"gate": None},
        "reasoning": {"max_tokens": 96},  # the scripted reply is the reasoning prompt's
        "references": {"workers": 0, "cache": False},
        "strategy": "checked",
        "strategies": {"checked": ["references", "evidence", "reasoning", STAGE]},
        "prompts": {STAGE: str(PROMPT_FILE.relative_to(REPO_ROOT))},
        STAGE: settings,
    }), encoding="utf-8")
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_a_stage_file_named_by_the_config_runs_with_what_it_declares(tmp_path):
    done = run("-c", DRIVER, str(overlay(tmp_path, references=2)), str(SAMPLE), "no")
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert found["pipeline"] == ["references", "evidence", "reasoning", STAGE]
    assert "answer_similarity" in found["resources"] and "embedder" in found["resources"]  # and what it depends on
    assert found["settings"] == {"references": 2, "max_tokens": 4, "withhold": True}
    assert {"answer_check", "answer_check.references", "answer_check.withhold"} <= set(found["keys"])
    assert found["shown"] == [2, 2]  # the setting reached the stage
    assert found["answers"] == ["i don't know", "i don't know"]  # "no": withheld
    for record in found["records"]:
        assert record["support"] == "unsupported"  # the field, in the record form the stage declares
        # the signal is the cosine of the answer (the reasoning reply's) and the best reference
        vectors = HashEmbedder().encode(["science fiction", record["references"][0]["text"]])
        cosine = float(vectors[0] @ vectors[1] / (np.linalg.norm(vectors[0]) * np.linalg.norm(vectors[1])))
        assert record["signals"]["answer_check.similarity"] == pytest.approx(cosine, abs=1e-6)
        assert record["reason"] == "answer_check: the references do not support the answer"
    assert found["records"][0]["signals"]["answer_check.similarity"] > 0.1  # the answer's words are in the reference


def test_a_supported_answer_stays_and_withhold_false_keeps_an_unsupported_one(tmp_path):
    supported = json.loads(run("-c", DRIVER, str(overlay(tmp_path)), str(SAMPLE), "yes").stdout)
    assert supported["answers"] == ["science fiction"] * 2
    assert {r["support"] for r in supported["records"]} == {"supported"}
    assert supported["shown"] == [3, 3]  # the default
    kept = json.loads(run("-c", DRIVER, str(overlay(tmp_path, withhold=False)), str(SAMPLE), "no").stdout)
    assert kept["answers"] == ["science fiction"] * 2 and {r["support"] for r in kept["records"]} == {"unsupported"}


def test_the_budget_plan_counts_the_stage_by_its_own_estimate(tmp_path):
    done = run("-m", "tools.budget_plan", "--overlay", str(overlay(tmp_path, references=2, max_tokens=7)),
               "--prefill-tps", "2000", "--step-ms", "20")
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [line.split() for line in done.stdout.splitlines() if line.startswith(STAGE)]
    template = -(-len(load_prompt(PROMPT_FILE).fixed_text()) // 4) + 40  # what the prompt renders for every query
    assert row[1:4] == [str(template + 2 * 1000 // 4), "7", "1"]  # prompt tokens/query, generated tokens, sequences


def test_a_misspelt_key_of_the_stage_is_one_line_with_the_closest_name(tmp_path):
    done = run("-m", "tools.budget_plan", "--overlay", str(overlay(tmp_path, referenes=2)), "--prefill-tps", "2000",
               "--step-ms", "20")
    assert done.returncode == 2
    assert "unknown key 'answer_check.referenes'; did you mean 'references'?" in done.stderr
    assert "Traceback" not in done.stderr


# The walk: a stage before the answer whose evidence block reaches the reasoning prompt, every LLM call recorded.
EVIDENCE_DRIVER = """
import json, sys
from models.loading import load_config
from models.system import CragSystem
from tests.conftest import to_batch
from tests.fakes import SEED_REPLY, HashEmbedder, ScriptedLLM

config = load_config("configs/cpu.yaml", ["configs/overlays/vllm-cpu.yaml", sys.argv[1]])
system = CragSystem(config, llm=ScriptedLLM(lambda c: SEED_REPLY), embedder=HashEmbedder())
examples = [json.loads(line) for line in open(sys.argv[2], encoding="utf-8")][:2]
result = system.answer_batch(to_batch(examples))
system.close()
print(json.dumps({"records": result.trace, "settings": config.resolved()["page_dates"], "pages": examples,
                  "max_tokens": config.reasoning.max_tokens}))
"""


SHIPPED = (REPO_ROOT / "configs" / "cpu.yaml", REPO_ROOT / "configs" / "overlays" / "vllm-cpu.yaml")


def dated_overlay(tmp_path: Path) -> Path:
    """What docs/how-to/add-a-stage.md has a user add to the shipped config: the stage's module, the shipped
    strategy with the stage before the answer, and its setting; nothing of the answer's own settings."""
    from models.loading import load_config

    names = load_config(SHIPPED[0], [SHIPPED[1]]).strategy_names()
    path = tmp_path / "dated.yaml"
    path.write_text(yaml.safe_dump({
        "stage_modules": ["tests.stages.page_dates"], "strategy": "dated",
        "strategies": {"dated": [*names[:-1], "page_dates", names[-1]]}, "page_dates": {"max_dates": 1},
        "record_prompts": True, "references": {"workers": 1, "cache": False},
    }), encoding="utf-8")
    return path


def test_a_stage_file_adds_evidence_that_reaches_the_prompt_that_answers_on_the_shipped_config(tmp_path):
    """configs/cpu.yaml with configs/overlays/vllm-cpu.yaml as make eval runs them: the reasoning prompt is off and
    the summariser answers; the stage's block is in the summariser prompt that produced each answer."""
    done = run("-c", EVIDENCE_DRIVER, str(dated_overlay(tmp_path)), str(SAMPLE))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert found["settings"] == {"max_dates": 1} and found["max_tokens"] == 0  # the shipped summariser path
    for record, example in zip(found["records"], found["pages"]):
        newest = max(example["search_results"], key=lambda page: page["page_last_modified"])
        line = f"{newest['page_name'].strip()}: {newest['page_last_modified']}"
        assert record["page_dates"] == [line]  # the field, in its record form; one date: the setting reached it
        assert record["signals"]["page_dates.count"] == 1
        assert record["signals"]["reasoning.summariser"] is True  # the summariser gave the answer
        (summariser,) = [p for p in record["prompts"] if p["prompt"] == "summariser"]
        assert f"When the pages were last updated:\n- {line}\nCurrent time:" in summariser["messages"][1]["content"]
        assert "unshown" not in record


def test_the_budget_plan_counts_the_stage_s_evidence_in_the_prompt_that_answers(tmp_path):
    def summariser_tokens(*overlays: Path) -> int:
        done = run("-m", "tools.budget_plan", "--config", str(SHIPPED[0]), *[a for o in (SHIPPED[1], *overlays)
                                                                              for a in ("--overlay", str(o))],
                   "--prefill-tps", "2000", "--step-ms", "20")
        assert done.returncode == 0, done.stderr[-3000:]
        (row,) = [line.split() for line in done.stdout.splitlines() if line.startswith("summariser")]
        return int(row[1])

    from tests.stages.page_dates import LINE_CHARS

    assert summariser_tokens(dated_overlay(tmp_path)) - summariser_tokens() == LINE_CHARS // 4  # max_dates: 1


def test_no_project_module_names_the_stage():
    tracked = subprocess.run(["git", "ls-files", "*.py", "*.yaml", "*.yml", "Makefile"], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    naming = [path for path in tracked if not path.startswith("tests/")
              and any(stage in (REPO_ROOT / path).read_text(encoding="utf-8") for stage in (STAGE, "page_dates"))]
    assert naming == []
    assert STAGE_FILE.is_file() and PROMPT_FILE.is_file()
