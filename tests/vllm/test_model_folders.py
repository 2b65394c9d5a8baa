"""The folders the project writes read as the same model in the image's transformers 4.57 and in vLLM as in the
transformers 5 that wrote them: the RoPE base, type and scaling of each family a competitor serves, the embedded
SmolLM2, the quantizer's W4A16 of a Llama-3.1-shaped model; and a folder saved by transformers 5 without the fix
is refused where it meets the engine, by the same rule tools/check_submission.py and --serve-llm apply.

`make test-vllm` writes the folders first with .venv's transformers 5: runs/vllm/families (tests/model_families.py,
as save_pretrained wrote them) and runs/vllm/llama3.1-w4a16 (tools/quantize.py rtn of the Llama 3.1 one)."""

from __future__ import annotations

import json
import shutil

import pytest

from models.llm.vllm import check_engine_config
from tests.model_families import FAMILIES
from tests.vllm.conftest import RUNS, folder
from utils.model_folders import FolderError, check_folder, forward_mismatches, portable_folder, rope_by_layer

FAMILY_FOLDERS = RUNS / "families"
LLAMA31_W4A16 = RUNS / "llama3.1-w4a16"
LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192.0}


def engine_config(path) -> dict:
    """The config vLLM builds the model from, as a dict (its get_config, RoPE patched for transformers 4)."""
    from vllm.transformers_utils.config import get_config

    return get_config(str(path), trust_remote_code=False).to_dict()


def written(path) -> dict:
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_saved_by_transformers_5_is_misread_by_the_engine_and_refused_then_read_right(name, tmp_path):
    raw = folder(FAMILY_FOLDERS / name)
    saved = written(raw)
    # as saved: the engine reads another RoPE (or, for Gemma 3's nested rope_parameters, cannot read it) ...
    try:
        assert forward_mismatches(saved, engine_config(raw)), "the engine read the RoPE right without the fix"
    except ValueError as err:
        assert "rope_type" in str(err) and name.startswith("gemma3")
    # ... and the rule refuses it before the engine starts
    with pytest.raises(FolderError, match="rope_parameters"):
        check_engine_config(raw)
    fixed = tmp_path / name
    shutil.copytree(raw, fixed)
    assert portable_folder(fixed)
    check_engine_config(fixed)  # the rule and vLLM's own config agree with the folder
    assert forward_mismatches(saved, engine_config(fixed)) == []


def test_the_image_s_transformers_reads_each_family_s_rope_from_the_portable_folder(tmp_path):
    from transformers import AutoConfig

    for name in FAMILIES:
        fixed = tmp_path / name
        shutil.copytree(folder(FAMILY_FOLDERS / name), fixed)
        portable_folder(fixed)
        text = AutoConfig.from_pretrained(fixed).get_text_config()
        layers = rope_by_layer(written(fixed))
        full = layers["full_attention"]
        assert float(text.rope_theta) == full["rope_theta"], name
        scaling = {k: v for k, v in full.items() if k != "rope_theta"}
        assert (text.rope_scaling or {"rope_type": "default"}) == pytest.approx(scaling), name
        if "sliding_attention" in layers:
            assert text.rope_local_base_freq == layers["sliding_attention"]["rope_theta"], name


def test_the_llama_3_1_folder_through_the_quantizer_keeps_its_rope():
    """tools/quantize.py rtn (.venv-quantize's transformers 5) wrote it: the engine reads base 500000 with the
    llama3 factors."""
    path = folder(LLAMA31_W4A16)
    check_engine_config(path)
    assert rope_by_layer(engine_config(path)) == {"full_attention": LLAMA31_ROPE}
    from transformers import AutoConfig

    read = AutoConfig.from_pretrained(path)
    assert read.rope_theta == 500000.0 and read.rope_scaling["rope_type"] == "llama3"


def test_the_embedded_folder_is_served_with_its_rope_base(smollm2):
    """The embedded converter's SmolLM2 (RoPE base 100000; transformers 4.57's default is 10000)."""
    from transformers import AutoConfig

    check_folder(smollm2)
    check_engine_config(smollm2)
    assert AutoConfig.from_pretrained(smollm2).rope_theta == 100000.0
    assert rope_by_layer(engine_config(smollm2)) == {"full_attention": {"rope_type": "default",
                                                                         "rope_theta": 100000.0}}
