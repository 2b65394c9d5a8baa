import subprocess
import sys

import pytest

from models.config import REPO_ROOT, ConfigError, SystemConfig
from models.llm.profile import load_profile
from models.loading import load_config
from tests.conftest import write


def test_shipped_configs_load():
    cpu = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    gpu = load_config(REPO_ROOT / "configs" / "t4x4-llama3-70b-gptq.yaml")
    assert cpu.llm.backend == "hf" and 1 <= cpu.batch_size <= 16
    assert gpu.llm.backend == "vllm" and gpu.llm.vllm.tensor_parallel_size == 4
    assert gpu.llm.vllm.dtype == "float16"
    assert load_profile(gpu.llm.profile).quantization is None  # the folder's compressed-tensors
    r2ag = gpu.section("r2ag")
    assert gpu.llm.vllm.enable_prompt_embeds is False and not (r2ag.enabled and r2ag.mode == "prompt")


def test_the_single_gpu_config_loads_and_reaches_vllm_serve_through_openai():
    """configs/gpu1-llama3-8b-w4a16.yaml: the whole pipeline on one GPU, the LLM behind `vllm serve` (the command
    `local_evaluation.py serve-command` prints; tests/unit/test_vllm_engine_api.py checks its flags against the
    release)."""
    config = load_config(REPO_ROOT / "configs" / "gpu1-llama3-8b-w4a16.yaml")
    assert config.llm.backend == "openai" and config.llm.openai.base_url == "http://127.0.0.1:8000/v1"
    assert load_profile(config.llm.profile).name == "llama3-8b-w4a16" and config.llm.openai.native_n
    assert config.llm.openai.weights == "server"  # the weights are the server's: the record asks it what it serves
    assert 1 <= config.batch_size <= 16 and config.embedder.device == "cuda"
    assert not config.section("r2ag").enabled  # the openai backend sends text: R2AG prompt mode would fall back


def test_unknown_key_names_key_and_file(tmp_path):
    path = write(tmp_path / "c.yaml", "batch_size: 2\nbatchsize: 3\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: unknown key 'batchsize'; did you mean 'batch_size'\?"):
        load_config(path)


def test_unknown_nested_key_names_its_path(tmp_path):
    path = write(tmp_path / "c.yaml", "llm:\n  hf:\n    modle: x\n")
    with pytest.raises(ConfigError, match=r"unknown key 'llm\.hf\.modle'"):
        load_config(path)


def test_internal_field_is_not_a_key(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'source'"):
        load_config(write(tmp_path / "c.yaml", "source: x\n"))


def test_crag_config_env_selects_file(tmp_path, monkeypatch):
    path = write(tmp_path / "mine.yaml", "batch_size: 7\nreferences:\n  top_k: 3\n")
    monkeypatch.setenv("CRAG_CONFIG", str(path))
    config = load_config()
    assert (config.batch_size, config.references.top_k, config.source) == (7, 3, str(path))
    assert config.reasoning.max_tokens == SystemConfig().reasoning.max_tokens  # defaults fill the rest


@pytest.mark.parametrize("text, message", [
    ("batch_size: 17\n", "'batch_size' must be in 1..16, got 17"),
    ("batch_size: 0\n", "'batch_size' must be in 1..16, got 0"),
    ("batch_size: two\n", "'batch_size' must be int"),
    ("batch_size: true\n", "'batch_size' must be int"),
    ("llm:\n  backend: llamacpp\n", "'llm.backend' is 'llamacpp'; one of \\['hf', 'openai', 'vllm'\\]"),
    ("kg:\n  method: function\n", "'kg.method' is 'function'; did you mean 'functions'\\?"),
    ("task: 4\n", "'task' is 4; one of"),
    ("task: true\n", "'task' is True; one of"),  # pydantic alone reads true as the literal 1
    ("record_prompts: 1\n", "'record_prompts' must be bool, got 1"),
    ("budget:\n  per_query_s: '20'\n", "'budget.per_query_s' must be float, got '20'"),
    ("reasoning:\n  samples: 1.5\n", "'reasoning.samples' must be int, got 1.5"),
    ("strategies:\n  mine: [1]\n", "'strategies.mine\\[0\\]' must be str, got 1"),
    ("budget:\n  stage_share: {kg: high}\n", "'budget.stage_share.kg' must be float, got 'high'"),
    ("embedder:\n  max_seq_length: 0\n", "'embedder.max_seq_length' must be at least 1, got 0"),
    ("llm:\n  hf:\n    model: 2024-01-01\n", "datetime.date\\(2024, 1, 1\\) is not a string, .*quote it"),
    ("attributes:\n  dynamic_classes: [realtime]\n", "'attributes.dynamic_classes\\[0\\]' is 'realtime'; did you mean"),
    ("r2ag:\n  threshold: 1.5\n", "'r2ag.threshold' must be in 0..1, got 1.5"),
    ("kg:\n  retries: -1\n", "'kg.retries' must be at least 0, got -1"),
    ("strategy: hybird\n", "strategy 'hybird' is not in strategies; did you mean 'hybrid'\\?"),
    ("references: 3\n", "'references' must be a mapping"),
    ("- a\n- b\n", "top level must be a mapping"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_values_are_errors(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path / "c.yaml", text))


def test_int_accepted_for_float_and_missing_file_named(tmp_path):
    assert load_config(write(tmp_path / "c.yaml", "budget:\n  per_query_s: 20\n")).budget.per_query_s == 20.0
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_overlays_and_sets_merge_key_by_key_after_the_file(tmp_path):
    base = write(tmp_path / "base.yaml", "batch_size: 2\nkg:\n  method: rules\n  max_calls: 3\n")
    overlay = write(tmp_path / "functions.yaml", "kg:\n  method: functions\n")
    config = load_config(base, overlays=[overlay], sets=["kg.max_calls=9", "references.use_snippets=false"])
    assert (config.batch_size, config.section("kg").method, config.section("kg").max_calls) == (2, "functions", 9)
    assert config.references.use_snippets is False and config.source.endswith("--set references.use_snippets")
    with pytest.raises(ConfigError, match="--set 'kg.max_calls': write KEY=VALUE"):
        load_config(base, sets=["kg.max_calls"])
    with pytest.raises(ConfigError, match=r"unknown key 'kg\.max_call'; did you mean 'max_calls'\?"):
        load_config(base, sets=["kg.max_call=2"])


def test_strategies_add_to_the_defaults_and_splice_yaml_aliases(tmp_path):
    text = ("strategy: mine\nstrategies:\n  base: &base [attributes, references]\n"
            "  mine: [*base, reasoning]\n")
    config = load_config(write(tmp_path / "c.yaml", text))
    assert config.strategies["mine"] == ["attributes", "references", "reasoning"]
    assert config.strategies["hybrid"] == SystemConfig().strategies["hybrid"]  # the defaults stay


@pytest.mark.parametrize("overlay", sorted((REPO_ROOT / "configs" / "overlays").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_overlays_load_over_both_configs(overlay):
    for base in ("cpu.yaml", "t4x4-llama3-70b-gptq.yaml"):
        config = load_config(REPO_ROOT / "configs" / base, [overlay])
        assert config.source.endswith(overlay.name) and config != load_config(REPO_ROOT / "configs" / base)


def test_loading_a_config_imports_no_model_framework():
    """Every command loads a config, and loading imports every built-in stage to know its section; a stage that
    imports torch, transformers or sentence-transformers at module level makes each command (and each checker
    probe) pay for it. Such imports belong where a model is built."""
    frameworks = ("torch", "transformers", "sentence_transformers", "openvino")
    code = (f"import sys; from models.loading import load_config; load_config(); "
            f"print(sorted(m for m in {frameworks!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
