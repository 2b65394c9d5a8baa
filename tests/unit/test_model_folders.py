"""utils/model_folders.py: a folder transformers 5 wrote loads as the same model in transformers 4.57: a tokenizer
class 4.57 knows, and the RoPE keys it reads beside rope_parameters (each family of tests/model_families.py, saved
by .venv's transformers 5; tests/vllm reads the same folders with 4.57 and vLLM)."""

import json

import pytest

from tests.model_families import FAMILIES, write
from utils.model_folders import (
    MISSING,
    FolderError,
    check_folder,
    forward_mismatches,
    portable_config,
    portable_folder,
    portable_tokenizer,
    rope_by_layer,
    rope_mismatches,
)


def test_a_transformers_5_class_is_replaced_and_the_rest_kept(tmp_path):
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"tokenizer_class": "TokenizersBackend", "model_max_length": 8192, "x": "é"}))
    path.chmod(0o640)
    assert portable_tokenizer(tmp_path) == "TokenizersBackend"
    assert json.loads(path.read_text()) == {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
                                            "x": "é"}
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer_config.json"]  # no staging file left


def test_a_portable_or_absent_config_is_left_alone(tmp_path):
    assert portable_tokenizer(tmp_path) is None
    path = tmp_path / "tokenizer_config.json"
    path.write_text('{"tokenizer_class": "LlamaTokenizerFast"}')
    assert portable_tokenizer(tmp_path) is None
    assert path.read_text() == '{"tokenizer_class": "LlamaTokenizerFast"}'


# --- RoPE: the keys transformers 4.57 reads beside transformers 5's -------------------------------------------------

def config_json(folder):
    return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_saved_by_transformers_5_is_refused_then_made_portable(tmp_path, name):
    from transformers import AutoConfig

    folder = write(tmp_path, name)
    saved = config_json(folder)
    text = saved.get("text_config", saved)
    assert "rope_theta" not in text and "rope_scaling" not in text, "transformers 5 wrote the old keys: rethink"
    read_before = AutoConfig.from_pretrained(folder).get_text_config().rope_parameters
    with pytest.raises(FolderError, match=r"rope_theta is .* in rope_parameters .* tools/model_folder.py portable"):
        check_folder(folder)

    changed = portable_config(folder)
    assert "rope_theta" in changed
    check_folder(folder)
    assert portable_config(folder) == []  # idempotent
    fixed = config_json(folder)
    # transformers 5 reads the same RoPE (it reads rope_parameters first) ...
    assert AutoConfig.from_pretrained(folder).get_text_config().rope_parameters == read_before
    # ... and the top-level keys alone (all transformers 4.57 reads) say the same RoPE
    legacy = {k: v for k, v in fixed.get("text_config", fixed).items() if k != "rope_parameters"}
    assert rope_by_layer(legacy) == rope_by_layer(saved)
    assert rope_mismatches(fixed) == []


def test_the_llama_3_1_keys_written(tmp_path):
    folder = write(tmp_path, "llama3.1")
    portable_config(folder)
    fixed = config_json(folder)
    assert fixed["rope_theta"] == 500000.0
    assert fixed["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_gemma_3_keys_written_by_layer_type(tmp_path):
    """Global layers: rope_theta and rope_scaling; sliding layers: rope_local_base_freq. A default global RoPE is
    written as {"rope_type": "default"}, not null: vLLM takes the nested rope_parameters for a null rope_scaling."""
    for name, scaling in (("gemma3", {"rope_type": "linear", "factor": 8.0}), ("gemma3-1b", {"rope_type": "default"})):
        portable_config(write(tmp_path, name))
        fixed = config_json(tmp_path / name)
        assert (fixed["rope_theta"], fixed["rope_scaling"], fixed["rope_local_base_freq"]) == (1e6, scaling, 1e4)
    mm = config_json(write(tmp_path, "gemma3-mm"))
    portable_config(tmp_path / "gemma3-mm")
    assert config_json(tmp_path / "gemma3-mm")["text_config"]["rope_local_base_freq"] == 1e4
    assert "rope_theta" not in config_json(tmp_path / "gemma3-mm")  # written where the text model's keys are
    assert mm["text_config"]["rope_parameters"] == config_json(tmp_path / "gemma3-mm")["text_config"]["rope_parameters"]


def test_a_folder_of_transformers_4_or_without_rope_is_left_alone(tmp_path):
    old = {"model_type": "llama", "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert portable_config(tmp_path) == []
    check_folder(tmp_path)
    assert config_json(tmp_path) == old
    assert portable_config(tmp_path / "absent") == []
    check_folder(tmp_path / "absent")  # no config.json: the engine's own error says why


def test_a_top_level_key_that_disagrees_is_named_with_both_values(tmp_path):
    config = {"rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}, "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(FolderError) as caught:
        check_folder(tmp_path)
    assert "rope_theta is 100000.0 in rope_parameters" in str(caught.value)
    assert "but 10000.0 at the top level" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert portable_folder(tmp_path) == ["config.json rope_theta"]
    assert config_json(tmp_path)["rope_theta"] == 100000.0


def test_the_older_spelling_of_rope_type_and_a_null_default_scaling_agree():
    config = {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
              "rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert rope_mismatches(config) == []
    assert rope_mismatches({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "rope_theta": 10000}) == []


def test_forward_mismatches_name_the_rope_key_and_the_other_fields():
    folder = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0},
              "sliding_window": 4096, "head_dim": 64, "tie_word_embeddings": False}
    engine = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0},
              "sliding_window": None, "head_dim": 64, "tie_word_embeddings": False, "extra": 1}
    assert forward_mismatches(folder, engine) == [("rope_theta (full_attention)", 500000.0, 10000.0),
                                                  ("sliding_window", 4096, None)]
    local = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "rope_local_base_freq": 1e4}
    nested = {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    assert forward_mismatches(nested, local) == []
    assert forward_mismatches(nested, {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) == [
        ("rope_theta (sliding_attention)", 1e4, MISSING), ("rope_type (sliding_attention)", "default", MISSING)]


def test_the_command_checks_and_makes_a_folder_portable(tmp_path):
    import subprocess
    import sys

    from models.config import REPO_ROOT

    folder = write(tmp_path, "mistral")

    def run(*args):
        return subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "model_folder.py"), *args], text=True,
                              capture_output=True, timeout=120)

    refused = run("check", "--model", str(folder))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "rope_theta is 1000000.0" in refused.stderr
    made = run("portable", "--model", str(folder))
    assert made.returncode == 0 and "wrote config.json rope_theta" in made.stdout, made.stderr
    assert run("check", "--model", str(folder)).returncode == 0
    assert run("portable", "--model", str(folder)).stdout.strip().endswith("already portable")
    missing = run("check", "--model", str(tmp_path / "none"))
    assert missing.returncode == 2 and "no config.json" in missing.stderr and "Traceback" not in missing.stderr
