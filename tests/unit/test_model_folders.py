"""utils/model_folders.py: a tokenizer class only transformers 5 knows becomes one transformers 4 knows too."""

import json

from utils.model_folders import portable_tokenizer


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
