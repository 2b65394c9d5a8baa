"""tools/quantize.py: GPTQ W4A16 g64 of the embedded SmolLM2-135M into the compressed-tensors folder vLLM loads,
and its one-line errors for bad inputs.

Run from the quantization venv (`make test-quantize`), after the runtime venv has built the fp16 folder and the
texts (the gguf and texts commands need .venv):

    .venv/bin/python tools/quantize.py gguf --out runs/quantize/test/fp16 --force
    .venv/bin/python tools/quantize.py texts --model runs/quantize/test/fp16 --limit 4 --held-out 1 \\
        --out runs/quantize/test/texts.jsonl
    .venv-quantize/bin/python -m pytest tests/quantize -p no:cacheprovider

QUANTIZE_TEST_MODEL and QUANTIZE_TEST_TEXTS point elsewhere. Under `make test` (.venv, no llm-compressor) the
quantizing tests skip and the input checks run. Only the standard library, pytest and what .venv-quantize holds
are imported here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tools import quantize
from training import quantization

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "quantize.py"
FP16 = Path(os.environ.get("QUANTIZE_TEST_MODEL", REPO / "runs" / "quantize" / "test" / "fp16"))
TEXTS = Path(os.environ.get("QUANTIZE_TEST_TEXTS", REPO / "runs" / "quantize" / "test" / "texts.jsonl"))
CALIBRATION_TEXTS, MAX_SEQ_LENGTH = 2, 256  # enough for GPTQ's Hessians to be used; about a minute on one thread
SMOLLM2_SIZES = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "head_dim": 64,
                 "num_key_value_heads": 3, "num_hidden_layers": 30, "model_type": "llama"}


def tool(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The exit status is 2 and stderr one line (no traceback) holding each needle."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- bad inputs: checked before torch is imported, so these run in either venv --------------------------------


@pytest.fixture
def config_only(tmp_path: Path) -> Path:
    """A folder with SmolLM2-135M's config.json and no weights: enough for every check made before loading."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMOLLM2_SIZES), encoding="utf-8")
    return folder


@pytest.fixture
def texts_file(tmp_path: Path) -> Path:
    path = tmp_path / "texts.jsonl"
    path.write_text(json.dumps({"text": "Question: what is two plus two?\nAnswer: four"}) + "\n", encoding="utf-8")
    return path


def test_group_size_that_does_not_divide_the_hidden_size(config_only: Path, texts_file: Path, tmp_path: Path):
    result = tool("gptq", "--model", config_only, "--texts", texts_file, "--group-size", 100, "--out", tmp_path / "q")
    one_line_error(result, "--group-size 100 does not divide hidden_size 576", "(e.g. 64)")
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("group_size", [0, -5])
def test_group_size_not_positive(config_only: Path, tmp_path: Path, group_size: int):
    one_line_error(tool("rtn", "--model", config_only, "--group-size", group_size, "--out", tmp_path / "q"),
                   f"--group-size {group_size}: must be a positive number")


def test_out_is_a_file(config_only: Path, texts_file: Path, tmp_path: Path):
    out = tmp_path / "out.txt"
    out.write_text("keep me", encoding="utf-8")
    result = tool("gptq", "--model", config_only, "--texts", texts_file, "--group-size", 64, "--out", out)
    one_line_error(result, f"--out {out}: a file, not a folder")
    assert out.read_text(encoding="utf-8") == "keep me"


def test_out_not_empty_needs_force(config_only: Path, tmp_path: Path):
    out = tmp_path / "q"
    out.mkdir()
    (out / "model.safetensors").write_text("old", encoding="utf-8")
    one_line_error(tool("rtn", "--model", config_only, "--group-size", 64, "--out", out), "--force")
    assert (out / "model.safetensors").read_text(encoding="utf-8") == "old"


@pytest.mark.parametrize("case", ["missing", "file", "no config"])
def test_model_that_is_not_a_model_folder(tmp_path: Path, case: str):
    model = tmp_path / "model"
    if case == "file":
        model.write_text("not a folder", encoding="utf-8")
    elif case == "no config":
        model.mkdir()
    one_line_error(tool("rtn", "--model", model, "--group-size", 64, "--out", tmp_path / "q"), f"--model {model}")


@pytest.mark.parametrize("content, needle", [
    (None, "no such file"),
    ("{not json\n", ":1: not JSON"),
    ('{"txt": "x"}\n', 'needs a "text" string'),
    ('{"text": "x", "split": "held_out"}\n', "no non-empty calibration texts"),
])
def test_bad_calibration_texts(config_only: Path, tmp_path: Path, content: str | None, needle: str):
    texts = tmp_path / "texts.jsonl"
    if content is not None:
        texts.write_text(content, encoding="utf-8")
    result = tool("gptq", "--model", config_only, "--texts", texts, "--group-size", 64, "--out", tmp_path / "q")
    one_line_error(result, f"--texts {texts}", needle)


@pytest.mark.parametrize("flag, value", [("--max-seq-length", 8), ("--dampening", 1.5)])
def test_bad_gptq_settings(config_only: Path, texts_file: Path, tmp_path: Path, flag: str, value: float):
    result = tool("gptq", "--model", config_only, "--texts", texts_file, "--group-size", 64, flag, value,
                  "--out", tmp_path / "q")
    one_line_error(result, f"{flag} {value}")


def test_missing_flag_is_one_line(config_only: Path):
    one_line_error(tool("rtn", "--model", config_only), "--out", "--help")


def test_group_size_check_reads_every_layer_width():
    """down_proj's input is the intermediate size and o_proj's heads x head dim: each must divide too."""
    wide = dict(SMOLLM2_SIZES, hidden_size=1024, num_attention_heads=16, head_dim=64)
    quantize.check_group_size(wide, 128, Path("m"))
    with pytest.raises(quantize.QuantizeError, match="does not divide intermediate_size 1600 .*e.g. 64"):
        quantize.check_group_size(dict(wide, intermediate_size=1600), 128, Path("m"))  # 1600 = 25 x 64
    with pytest.raises(quantize.QuantizeError, match="does not divide num_attention_heads x head_dim 960"):
        quantize.check_group_size(dict(wide, num_attention_heads=12, head_dim=80), 128, Path("m"))


def test_cut_keeps_head_quarter_and_tail():
    ids = list(range(100))
    assert quantization.cut(ids, 100) == ids
    assert quantization.cut(ids, 20) == ids[:5] + ids[85:]


# --- GPTQ on SmolLM2-135M (.venv-quantize) --------------------------------------------------------------------


def rows() -> list[dict[str, Any]]:
    if not FP16.joinpath("config.json").is_file() or not TEXTS.is_file():
        pytest.fail(f"no fp16 folder {FP16} or texts {TEXTS}: build them with the runtime venv first, as "
                    "`make test-quantize` does (see this file's docstring)")
    return [json.loads(line) for line in TEXTS.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def gptq_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPTQ W4A16 g64 of the fp16 folder on its first calibration texts, through the command line, one thread."""
    pytest.importorskip("llmcompressor", reason="llm-compressor lives in .venv-quantize (make test-quantize)")
    calibration = [row for row in rows() if row.get("split", "calibration") == "calibration"][:CALIBRATION_TEXTS]
    assert calibration, f"{TEXTS} has no calibration rows"
    work = tmp_path_factory.mktemp("gptq")
    texts = work / "calibration.jsonl"
    texts.write_text("".join(json.dumps(row) + "\n" for row in calibration), encoding="utf-8")
    out = work / "smollm2-w4a16-g64"
    result = tool("gptq", "--model", FP16, "--texts", texts, "--group-size", 64, "--max-seq-length", MAX_SEQ_LENGTH,
                  "--threads", 1, "--device", "cpu", "--out", out)
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"wrote {out}: gptq W4A16 g64 on {len(calibration)} calibration texts" in result.stdout, result.stdout
    return out


@pytest.mark.integration
def test_gptq_folder_declares_pack_quantized_w4a16_g64(gptq_folder: Path):
    config = json.loads((gptq_folder / "config.json").read_text(encoding="utf-8"))
    quant = config["quantization_config"]
    assert (quant["quant_method"], quant["format"], quant["quantization_status"]) == (
        "compressed-tensors", "pack-quantized", "compressed")
    assert list(quant["config_groups"]) == ["group_0"]
    group = quant["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"] and group["input_activations"] is None
    weights = group["weights"]
    assert (weights["num_bits"], weights["type"], weights["symmetric"], weights["strategy"], weights["group_size"]) \
        == (4, "int", True, "group", 64)
    assert weights["actorder"] in (None, "static")  # no g_idx tensor: Marlin's fast path
    assert "lm_head" in quant["ignore"]
    assert config["dtype"] == "float16"
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):  # tokenizes as the fp16 model
        assert (gptq_folder / name).read_bytes() == (FP16 / name).read_bytes()
    assert (gptq_folder / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~current_umask()  # not 0600


@pytest.mark.integration
def test_gptq_weights_are_packed_int4_groups_of_64(gptq_folder: Path):
    from safetensors import safe_open

    with safe_open(gptq_folder / "model.safetensors", "pt") as handle:
        names = set(handle.keys())
        packed = handle.get_tensor("model.layers.0.mlp.down_proj.weight_packed")
        scale = handle.get_tensor("model.layers.0.mlp.down_proj.weight_scale")
    linears = {name.rsplit(".", 1)[0] for name in names if name.endswith(".weight_packed")}
    assert len(linears) == 30 * 7  # q, k, v, o, gate, up, down in each of the 30 layers
    assert not any(f"{linear}.weight" in names for linear in linears)  # no dense copy left beside the packed one
    assert not any(name.endswith("g_idx") for name in names)
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # tied, kept 16-bit
    assert str(packed.dtype) == "torch.int32" and tuple(packed.shape) == (576, 1536 // 8)  # 8 int4 per int32
    assert str(scale.dtype) == "torch.float16" and tuple(scale.shape) == (576, 1536 // 64)


@pytest.mark.integration
def test_gptq_folder_reloads_and_scores_near_the_reference(gptq_folder: Path):
    """Reloaded (decompressed to int4 x scale), it gives finite logits and next-token distributions close to the
    fp16 model's on a held-out text, and generates."""
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    held_out = [row["text"] for row in rows() if row.get("split") == "held_out"] or [rows()[-1]["text"]]
    tokenizer = AutoTokenizer.from_pretrained(gptq_folder)
    ids = quantization.tokenize(tokenizer, held_out[:1], MAX_SEQ_LENGTH)
    model = quantization.load_for_eval(gptq_folder, "cpu")
    with torch.inference_mode():
        logits = model(torch.tensor(ids)).logits
    assert logits.shape == (1, len(ids[0]), 49152)
    assert torch.isfinite(logits).all()
    result = quantization.score(quantization.load_for_eval(FP16, "cpu"), {"gptq": model}, ids, "cpu")
    assert math.isfinite(result["gptq"]["ppl"]) and math.isfinite(result["reference"]["ppl"])
    # a broken packing or scale gives several nats; 4-bit GPTQ of this model about 0.2
    assert 0 <= result["gptq"]["kl"] < 1.0, result
    assert result["gptq"]["ppl"] < 2 * result["reference"]["ppl"], result
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.inference_mode():
        generated = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] > prompt["input_ids"].shape[1]


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_the_quantize_benchmark_loads_in_the_venv_that_runs_it():
    """`make bench` runs benchmarks/gptq_vs_rtn.py in this venv, which lacks the runtime's packages (rapidfuzz, ...)."""
    done = subprocess.run([sys.executable, "-c", "import benchmarks.gptq_vs_rtn"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
