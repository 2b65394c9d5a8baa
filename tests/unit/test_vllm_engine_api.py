"""The keywords models/llm/vllm.py passes to vllm.LLM(...) and SamplingParams(...) exist in the pinned vLLM release.

Checked against data/vllm/engine_api-<version>.json (tools/vllm_engine_args.py, extracted from the wheel without
importing vllm), so no network, no wheel and no GPU are needed. When the vllm pin in requirements.txt changes,
regenerate the extract for the new version; a keyword the release does not take fails here, not on the grader's T4s.
"""

import inspect
import json
import re
import shlex
import sys
import types
from pathlib import Path

import pytest

from models.config import VLLMConfig
from models.llm.backend import GenParams
from models.llm.profile import ModelProfile, folder_profile, load_profile
from models.llm.vllm import VLLMBackend
from tests.vllm_fake import FakeLLMEngine, LoRARequest, install_config, model_folder

ROOT = Path(__file__).resolve().parents[2]


def pinned_vllm() -> str:
    pins = [m.group(1) for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
            if (m := re.fullmatch(r"vllm==(\S+)", line.split("#")[0].strip()))]
    assert len(pins) == 1, "requirements.txt must pin vllm exactly once (vllm==X)"
    return pins[0]


@pytest.fixture(scope="module")
def api():
    path = ROOT / "data" / "vllm" / f"engine_api-{pinned_vllm()}.json"
    assert path.is_file(), f"no {path.relative_to(ROOT)}: run tools/vllm_engine_args.py on the pinned wheel"
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture
def passed(monkeypatch, tmp_path):
    """The keyword arguments VLLMBackend gives vllm.LLM and vllm.SamplingParams, recorded by a fake vllm."""
    calls = {}

    class SamplingParams:
        def __init__(self, *args, **kwargs):
            calls.setdefault("sampling_args", []).append(args)
            calls.setdefault("sampling", []).append(kwargs)

    class LLM:
        def __init__(self, *args, **kwargs):
            calls["init_args"], calls["init"] = args, kwargs
            self.llm_engine = FakeLLMEngine()

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    monkeypatch.setitem(sys.modules, "vllm.lora", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm.lora.request", types.SimpleNamespace(LoRARequest=LoRARequest))
    install_config(monkeypatch)  # the backend checks the folder's config.json as the engine reads it
    folder = model_folder(tmp_path / "llama")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    # every optional field of the profile and the config set, so no keyword is left out for being None or off
    profile = folder_profile(folder, quantization="gptq", tokenizer=str(folder), dtype="bfloat16")
    llm = VLLMBackend(VLLMConfig(tensor_parallel_size=4, dtype="float16", lora=str(adapter)), profile)
    assert {"quantization", "tokenizer", "enable_lora", "max_lora_rank"} <= set(calls["init"])
    llm.sampling_params(GenParams(max_tokens=9, temperature=0.7, n=3, stop=["X"], seed=5, top_logprobs=2))
    llm.sampling_params(GenParams())
    return calls


def test_extract_is_the_pinned_release(api):
    assert api["version"] == pinned_vllm()
    assert re.fullmatch(r"[0-9a-f]{64}", api["sha256"]) and api["wheel"].startswith(f"vllm-{api['version']}-")


def test_llm_keywords_exist_in_the_release(api, passed):
    assert passed["init_args"] == (), "pass vllm.LLM keywords only: positions change between releases"
    params = {p["name"]: p["kind"] for p in api["llm_init"]["parameters"]}
    named = {n for n, kind in params.items() if kind in ("positional_or_keyword", "keyword_only")}
    # LLM(**kwargs) hands the rest to EngineArgs(...)
    engine_args = {f["name"] for f in api["engine_args"]["fields"]} if "var_keyword" in params.values() else set()
    unknown = sorted(set(passed["init"]) - named - engine_args)
    assert not unknown, f"vllm {api['version']}: LLM() and EngineArgs take no {unknown}"


def test_sampling_keywords_exist_in_the_release(api, passed):
    assert all(args == () for args in passed["sampling_args"])
    fields = {f["name"] for f in api["sampling_params"]["fields"] if not f["name"].startswith("_")}
    used = set().union(*passed["sampling"])
    unknown = sorted(used - fields)
    assert not unknown, f"vllm {api['version']}: SamplingParams takes no {unknown}"


def test_the_fake_engine_has_the_release_s_step_driver_methods(api):
    """VLLMBackend.generate drives LLM.llm_engine with add_request / step / abort_request /
    has_unfinished_requests, and reads LLM.get_tokenizer(); the unit tests' fake engine (FakeLLMEngine) must
    take exactly the parameters the pinned release's methods take, or those tests prove nothing."""
    from tests.vllm_fake import FakeLLMEngine

    methods = api["llm_engine"]["methods"]
    for name in ("add_request", "step", "abort_request", "has_unfinished_requests"):
        released = [p["name"] for p in methods[name]["parameters"]]
        fake = [p for p in inspect.signature(getattr(FakeLLMEngine, name)).parameters if p != "self"]
        assert fake == released, f"FakeLLMEngine.{name}{fake} is not vllm {api['version']}'s {released}"
    assert "llm_engine" in api["llm_class"]["attributes"] and "get_tokenizer" in api["llm_class"]["methods"]


def test_the_backend_calls_the_engine_only_as_the_release_allows(api):
    """Every keyword VLLMBackend gives add_request is a parameter of the release's add_request; positions are
    only the first three (request_id, prompt, params)."""
    import ast

    source = (ROOT / "models" / "llm" / "vllm.py").read_text(encoding="utf-8")
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr in api["llm_engine"]["methods"]]
    assert {call.func.attr for call in calls} >= {"add_request", "step", "abort_request", "has_unfinished_requests"}
    for call in calls:
        released = [p["name"] for p in api["llm_engine"]["methods"][call.func.attr]["parameters"]]
        assert len(call.args) <= min(len(released), 3) and {k.arg for k in call.keywords} <= set(released)


def test_the_t4_config_s_kv_cache_dtype_is_one_of_the_release_s(api):
    """The T4 config keeps the KV cache in the model's float16 ("auto"; fp8 needs a newer GPU): the value it
    resolves to, and that the release's EngineArgs has the field."""
    from models.loading import load_config

    config = load_config(ROOT / "configs" / "t4x4-llama3-70b-gptq.yaml")
    assert config.llm.backend == "vllm" and config.llm.vllm.kv_cache_dtype == "auto"
    assert "kv_cache_dtype" in {f["name"] for f in api["engine_args"]["fields"]}


def test_the_backend_reads_outputs_of_the_release_s_default_kind(api, passed):
    """VLLMBackend merges CUMULATIVE outputs by index; it passes no output_kind, so the release's default must be
    CUMULATIVE (a DELTA default would keep one token per sample, FINAL_ONLY would lose finished samples at the
    deadline)."""
    fields = {f["name"]: f for f in api["sampling_params"]["fields"]}
    assert fields["output_kind"]["default"] == "RequestOutputKind.CUMULATIVE"
    assert all("output_kind" not in kwargs for kwargs in passed["sampling"])


def test_the_fake_tokenizer_takes_the_release_s_parameters(api):
    """The backend calls encode and apply_chat_template on LLM.get_tokenizer(); the fake's parameters are the
    release's TokenizerLike ones (vllm/tokenizers/protocol.py)."""
    from tests.vllm_fake import FakeTokenizer

    for name, method in api["tokenizer"]["methods"].items():
        released = [(p["name"], p["kind"]) for p in method["parameters"]]
        parameters = inspect.signature(getattr(FakeTokenizer, name)).parameters.values()
        fake = [(p.name, p.kind.name.lower()) for p in parameters if p.name != "self"]
        assert fake == released, f"FakeTokenizer.{name}{fake} is not vllm {api['version']}'s {released}"


def test_the_fake_engine_takes_the_release_s_prompt_schemas(api):
    from tests.vllm_fake import FakeLLMEngine

    schemas = api["prompt_schemas"]
    assert FakeLLMEngine.TOKENS_PROMPT == {f["name"] for f in schemas["TokensPrompt"]}
    assert FakeLLMEngine.EMBEDS_PROMPT == {f["name"] for f in schemas["EmbedsPrompt"]}


def test_the_backend_s_prompts_follow_the_release_s_schemas(api, monkeypatch, tmp_path):
    """Token prompts and (R2AG) embedding prompts carry every required key of TokensPrompt / EmbedsPrompt and no
    other key; prompt_embeds is a 2-D torch.Tensor, as vllm/inputs/preprocess.py _process_embeds wants."""
    import numpy as np
    import torch

    from tests.vllm_fake import FakeLLMEngine, FakeTokenizer, SamplingParams

    engine = FakeLLMEngine()

    class LLM:
        def __init__(self, **kwargs):
            self.llm_engine = engine
            engine.engine_args = kwargs

        def get_tokenizer(self):
            return FakeTokenizer()

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    install_config(monkeypatch)
    llm = VLLMBackend(VLLMConfig(enable_prompt_embeds=True), folder_profile(model_folder(tmp_path / "m")))
    llm.generate([[{"role": "user", "content": "q"}]], GenParams(max_tokens=1))
    mark = llm.retrieval_placeholder()
    llm.generate_with_embeddings([[{"role": "user", "content": f"q {mark}"}]], [np.ones((1, 8))],
                                 GenParams(max_tokens=1))
    schemas = {name: ({f["name"] for f in fields if not f["annotation"].startswith("NotRequired")},
                      {f["name"] for f in fields}) for name, fields in api["prompt_schemas"].items() if name != "file"}
    kinds = []
    for _, prompt, _ in engine.added:
        kinds.append(next(name for name, (required, allowed) in schemas.items()
                          if required <= set(prompt) <= allowed))
    assert kinds == ["TokensPrompt", "EmbedsPrompt"]
    embeds = engine.added[1][1]["prompt_embeds"]
    assert isinstance(embeds, torch.Tensor) and embeds.ndim == 2 and embeds.shape[1] == 8


def unknown_serve_flags(api, command: list[str]) -> list[str]:
    """The flags of a `vllm serve` command the release's serve parser lacks: its own, FrontendArgs' and EngineArgs'
    (a boolean flag also as --no-...)."""
    cli = api["serve_cli"]
    known = set(cli["parser_flags"]) | set(cli["frontend_flags"]) | set(cli["engine_flags"])
    flags = [word.split("=")[0] for word in command if word.startswith("--")]
    return [f for f in flags if f not in known and not (f.startswith("--no-") and "--" + f[5:] in known)]


@pytest.mark.parametrize("name", ["gpu1-llama3-8b-w4a16.yaml", "t4x4-llama3-70b-gptq.yaml"])
def test_each_gpu_config_s_printed_vllm_serve_command_runs_on_the_release(api, name):
    """What `local_evaluation.py serve-command --config CONFIG` prints (docs/how-to/gpu-submission.md) uses flags
    the release's serve parser has, serves the profile's model under the name the openai backend asks for, where
    llm.openai.base_url points, with a context that holds the reasoning prompt."""
    from evaluation.llm_server import printed_serve_command
    from models.loading import load_config

    config = load_config(ROOT / "configs" / name)
    command = shlex.split(printed_serve_command(config))
    assert command[:2] == ["vllm", "serve"] and len(command) > 3, f"{name}: no `vllm serve` command"
    unknown = unknown_serve_flags(api, command)
    assert not unknown, f"vllm {api['version']} serve takes no {unknown}"
    profile = load_profile(config.llm.profile)
    served = command[command.index("--served-model-name") + 1]
    port = command[command.index("--port") + 1]
    assert served == profile.name and config.llm.openai.base_url.endswith(f":{port}/v1")
    assert int(command[command.index("--max-model-len") + 1]) == profile.max_model_len
    # the context holds the reasoning prompt's references (about 4 characters a token) and its answer
    assert profile.max_model_len >= config.reasoning.max_reference_chars // 4 + config.reasoning.max_tokens


def test_the_served_engine_s_flags_exist_in_the_release(api):
    """evaluation/llm_server.py's `vllm serve` (make eval's engine) uses flags the release's serve parser has, the
    ones that make its answers independent of load among them; so does a GPU's command with every optional flag
    on (a profile's quantization, tokenizer and chat template, the config's parallelism, KV cache and eager mode)."""
    from evaluation.llm_server import LOAD_INVARIANT, serve_command

    command = serve_command(Path("/m"), load_profile(), VLLMConfig(), "127.0.0.1", 8000, cpu=True)
    assert command[-len(LOAD_INVARIANT):] == LOAD_INVARIANT
    unknown = unknown_serve_flags(api, command)
    assert not unknown, f"vllm {api['version']} serve takes no {unknown}"
    profile = ModelProfile(name="m", weights=None, quantization="gptq", tokenizer="/t", chat_template="/t.jinja")
    engine = VLLMConfig(tensor_parallel_size=4, kv_cache_dtype="fp8", enforce_eager=True)
    command = serve_command(Path("/m"), profile, engine, "127.0.0.1", 8000)
    assert {"--quantization", "--tokenizer", "--chat-template", "--tensor-parallel-size", "--kv-cache-dtype",
            "--enforce-eager", "--gpu-memory-utilization"} <= set(command)
    unknown = unknown_serve_flags(api, command)
    assert not unknown, f"vllm {api['version']} serve takes no {unknown}"
