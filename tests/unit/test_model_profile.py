"""The model profile (configs/models/*.yaml, models/llm/profile.py): one file says which model runs, and every reader
takes it from there: the hf, vllm and openai backends, --serve-llm and serve-command, a run's manifest, a gate, the
budget plan and the submission checker. A second model folder (a two-layer Llama made at random) and a profile naming
it swap the model everywhere; the records name the weights that ran."""

from __future__ import annotations

import json
import re
import shutil
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from evaluation import manifest
from evaluation.llm_server import printed_serve_command, serve_command
from models.config import REPO_ROOT, ConfigError
from models.gate.answer_gate import Column, Gate, gate_for, signal_setup
from models.llm.backend import FAILED, BackendUnavailable, GenParams
from models.llm.backends import create_llm
from models.llm.hf import resolve_model_folder
from models.llm.openai import OpenAIBackend
from models.llm.profile import DEFAULT_PROFILE, PROFILES, load_profile, served_config, write_profile
from models.llm.weights import fingerprint, weights_of
from models.loading import load_config
from models.prompting import PromptLibrary
from tests.conftest import SAMPLE
from tests.openai_fake import ChatServer
from utils.model_folders import portable_folder

LONG = " ".join(f"reference{i} says the answer is {i}." for i in range(400))
CONFIGS = sorted((REPO_ROOT / "configs").glob("*.yaml"))
# The keys of a model's identity: the profile's, never a config's.
IDENTITY = ("model", "served_model_name", "quantization", "max_model_len", "max_input_tokens", "tokenizer",
            "chat_template", "prompt_tokens")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A Llama of two layers made at random, with the default model's tokenizer and chat template."""
    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_folder())
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=1024, bos_token_id=tokenizer.bos_token_id,
                                         eos_token_id=tokenizer.eos_token_id))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    portable_folder(folder)  # the keys the serving stack's transformers 4 reads, as the how-to has a user write
    return folder


def profile_file(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def tiny_profile(tmp_path: Path, folder: Path) -> Path:
    return profile_file(tmp_path / "tiny.yaml", f"name: tiny\nweights:\n  path: {folder}\nprompt_tokens: 128\n"
                                                "max_model_len: 512\ndtype: float32\n")


def smollm2_gate(config, path: Path) -> Path:
    """A gate fit (in name) on `config`'s setup: what `make gate` records, without its runs."""
    resolved = json.loads(json.dumps(config.resolved()))
    setup = signal_setup(resolved, PromptLibrary(config.prompts).digests())
    Gate([Column("answer.number", "number")], [0.0], [1.0], [1.0], 0.0, 0.5, fit_on={"setup": setup}).save(path)
    return path


def test_the_default_profile_is_the_embedded_smollm2():
    profile = load_profile()
    assert profile.name == "smollm2" and profile.weights_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert load_config(REPO_ROOT / "configs" / "cpu.yaml").llm.profile == DEFAULT_PROFILE
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f"sed -n 's/^ *install: *\\([^ #]*\\).*/\\1/p' {DEFAULT_PROFILE}" in makefile  # make setup installs it


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_shipped_config_names_a_profile_and_no_model_identity_of_its_own(path):
    """The profile is the model's one home: a config file, read raw, sets no identity key in any backend section,
    carries no `vllm serve` line to keep in step, and names a profile that reads without its weights present."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    llm = raw.get("llm") or {}
    assert "profile" in llm, f"{path.name} names no llm.profile"
    for backend in ("hf", "openai", "vllm"):
        assert not set(llm.get(backend) or {}) & set(IDENTITY), f"{path.name}: llm.{backend} sets a model key"
    assert not re.search(r"^#\s*vllm serve ", path.read_text(encoding="utf-8"), re.M), f"{path.name}: a serve line"
    profile = load_profile(llm["profile"])  # no weights needed (a GPU profile on this CPU machine)
    assert profile.source.startswith(str(REPO_ROOT / PROFILES))


def test_every_shipped_profile_reads_without_its_weights_and_fits_its_config_s_longest_prompt():
    for path in CONFIGS:
        config = load_config(path)
        profile = load_profile(config.llm.profile)
        # the reasoning prompt's references (about 4 characters a token) and its reply fit in the context
        assert profile.prompt_tokens + config.reasoning.max_tokens <= profile.max_model_len, path.name
        if config.reasoning.max_tokens:
            assert profile.prompt_tokens >= config.reasoning.max_reference_chars // 4, path.name


@pytest.mark.parametrize("text,said", [
    ("name: x\nweights: {path: m, package: p, file: f}\n", "give either path, or package and file"),
    ("name: x\nweights: {path: m}\nprompt_tokens: 4096\n", "leaves no room for a reply"),
    ("name: x\nweights: {path: m}\nprompt_tokns: 10\n", "prompt_tokns"),
    ("name: x\nweights: {path: m}\ndtype: int8\n", "dtype"),
    ("- a list\n", "not a mapping"),
    ("name: x\nweights: {path: m}\nsource: elsewhere\n", "'source' is not a profile key"),
])
def test_a_wrong_profile_is_one_line_naming_the_file_and_key(tmp_path, text, said):
    path = profile_file(tmp_path / "p.yaml", text)
    with pytest.raises(ConfigError, match=said) as caught:
        load_profile(str(path))
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="no such file"):
        load_profile(str(tmp_path / "none.yaml"))


def test_swapping_the_profile_swaps_the_model_everywhere(tmp_path, tiny):
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=[f"llm.profile={tiny_profile(tmp_path, tiny)}"])
    profile = load_profile(config.llm.profile)

    llm = create_llm(config.llm)  # the hf backend: the profile's weights and prompt limit
    assert llm.folder == tiny and llm.profile.prompt_tokens == 128
    ids, _ = llm.prompt_ids([{"role": "user", "content": LONG}])
    assert len(ids) == 128
    (sample,), = llm.generate([[{"role": "user", "content": LONG}]], GenParams(max_tokens=3))
    assert sample.text is not None  # a random model answers nonsense, but it answers

    recorded = manifest.answer_inputs(config, SAMPLE, 30.0, False)["weights"]  # a run's setup names it
    assert recorded["fingerprint"] == fingerprint(tiny)[0] and recorded["profile"]["name"] == "tiny"
    assert "converter" not in recorded  # a folder, not a converted .gguf

    command = serve_command(tiny, profile, config.llm.vllm, "127.0.0.1", 8000, cpu=True)  # what --serve-llm runs
    assert command[command.index("--served-model-name") + 1] == "tiny"
    assert command[command.index("--dtype") + 1] == "float32"
    assert command[command.index("--max-model-len") + 1] == "512"
    served = served_config(config, "http://127.0.0.1:1/v1").llm.openai
    # as many requests in flight as the engine runs: a request's timeout does not count the queue before it
    assert served.concurrency == int(command[command.index("--max-num-seqs") + 1]) == 1
    assert served.weights == "profile"  # the served weights are this machine's: the record fingerprints them
    served_record = manifest.answer_inputs(config, SAMPLE, 30.0, False, served_llm=True)["weights"]
    assert served_record["fingerprint"] == recorded["fingerprint"]


def test_the_openai_backend_cuts_at_the_profile_s_limit_served_or_not(tmp_path, tiny):
    """The profile's prompt limit in the openai backend, with the profile's tokenizer, whoever started the server:
    the served model (the fake follows vLLM's length check) would refuse the over-long prompt; it gets it cut as the
    hf backend cuts, its question kept."""
    tokenizer = AutoTokenizer.from_pretrained(tiny)

    def count(messages):
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"])

    server = ChatServer(max_model_len=512, count_tokens=count, answer_with=lambda body: "ok")
    profile = load_profile(str(tiny_profile(tmp_path, tiny)))
    conversation = [{"role": "system", "content": "Answer briefly."},
                    {"role": "user", "content": LONG + " Question: what is the answer?"}]
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    roomy = replace(profile, prompt_tokens=1000, max_model_len=4096)  # a limit the server does not hold
    (refused,), = OpenAIBackend(replace(config.llm.openai, base_url=server.url), roomy).generate(
        [conversation], GenParams(max_tokens=8))
    assert refused.finish_reason == FAILED and "maximum context length" in refused.failure  # HTTP 400: no answer
    (sample,), = OpenAIBackend(replace(config.llm.openai, base_url=server.url), profile).generate(
        [conversation], GenParams(max_tokens=8))
    assert sample.text == "ok"
    sent = server.requests[-1]["body"]
    assert sent["model"] == "tiny" and count(sent["messages"]) <= 128 and sent["messages"][0] == conversation[0]
    assert sent["messages"][1]["content"].endswith("Question: what is the answer?")  # the tail stays


def test_a_run_against_another_machine_s_server_records_its_report_and_no_local_hash(tmp_path, tiny):
    """With the weights on the server's machine (llm.openai.weights: server, the gpu1 config's case), the record
    holds what the server reports under the profile's name (vLLM's /v1/models), never a hash of SmolLM2's GGUF or of
    any folder here; a gate fit on the served SmolLM2 is refused for it, naming `make gate`."""
    server = ChatServer(models={"tiny": ("/srv/models/tiny", 512)})
    sets = [f"llm.profile={tiny_profile(tmp_path, tiny)}", "llm.backend=openai", f"llm.openai.base_url={server.url}"]
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=sets)
    recorded = manifest.answer_inputs(config, SAMPLE, 30.0, False)["weights"]
    assert recorded["server"] == {"id": "tiny", "root": "/srv/models/tiny", "max_model_len": 512}
    assert "fingerprint" not in recorded
    smollm2 = fingerprint(load_profile().weights_path())[0]
    assert smollm2 not in json.dumps(recorded) and fingerprint(tiny)[0] not in json.dumps(recorded)

    shipped = load_config(REPO_ROOT / "configs" / "cpu.yaml", [REPO_ROOT / "configs" / "overlays" / "vllm-cpu.yaml"])
    gate = smollm2_gate(served_config(shipped, "http://127.0.0.1:1/v1"), tmp_path / "gate.json")
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=[*sets, f"answer.gate={gate}"])
    with pytest.raises(ConfigError, match=r"fit on another setup.*llm\.fingerprint.*`make gate`") as caught:
        gate_for(config, PromptLibrary(config.prompts))
    assert "\n" not in str(caught.value)

    elsewhere = ChatServer(models={"other": ("/srv/other", 512)})  # the profile's name is not served there
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml",
                         sets=[*sets[:2], f"llm.openai.base_url={elsewhere.url}"])
    assert "serves no model 'tiny' (it serves: other)" in weights_of(json.loads(json.dumps(
        config.resolved()))["llm"])["server"]


def test_a_run_against_a_served_second_folder_records_its_fingerprint_and_the_server_s_report(
        monkeypatch, tmp_path, tiny):
    """A run whose served weights are this machine's (`weights: profile`, as --serve-llm sets it) names the served
    folder twice: `answers` holds its fingerprint, `served` what the server reported once it was up (the fake follows
    vLLM's /v1/models); no hash of SmolLM2's GGUF anywhere."""
    import local_evaluation
    from evaluation import run_command
    from tests.unit.test_hostile_inputs import ScriptedModel

    server = ChatServer(models={"tiny": (str(tiny), 512)})
    monkeypatch.setattr(run_command, "user_model", lambda config: ScriptedModel())
    out = tmp_path / "run"
    assert local_evaluation.main(["run", "--data", str(SAMPLE), "--out", str(out), "--limit", "1", "--time-limit",
                                  "0", "--set", f"llm.profile={tiny_profile(tmp_path, tiny)}", "--set",
                                  "llm.backend=openai", "--set", f"llm.openai.base_url={server.url}", "--set",
                                  "llm.openai.weights=profile", "--set", "answer.gate=null"]) == 0
    written = json.loads((out / "manifest.json").read_text())
    assert written["answers"]["weights"]["fingerprint"] == fingerprint(tiny)[0]
    assert written["served"] == {"id": "tiny", "root": str(tiny), "max_model_len": 512}
    assert fingerprint(load_profile().weights_path())[0] not in json.dumps(written)


@pytest.mark.parametrize("backend", ["hf", "openai", "vllm"])
def test_a_gate_fit_on_smollm2_is_refused_for_the_second_folder_on_every_backend(tmp_path, tiny, backend):
    sets = [f"llm.backend={backend}", "llm.openai.weights=profile"]
    base = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=sets)
    gate = smollm2_gate(base, tmp_path / "gate.json")
    accepted = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=[*sets, f"answer.gate={gate}"])
    gate_for(accepted, PromptLibrary(accepted.prompts))  # the setup it was fit on
    swapped = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=[
        *sets, f"answer.gate={gate}", f"llm.profile={tiny_profile(tmp_path, tiny)}"])
    with pytest.raises(ConfigError, match=r"fit on another setup.*llm\.fingerprint.*`make gate`"):
        gate_for(swapped, PromptLibrary(swapped.prompts))


def test_the_vllm_backend_loads_the_profile_s_folder_on_the_config_s_hardware(tmp_path, tiny, monkeypatch):
    """In-process vLLM (a fake engine that records its keywords): the folder, quantization, length and dtype are the
    profile's, the parallelism and memory share the config's, and a prompt over the profile's limit is cut."""
    from tests.vllm_fake import FakeLLMEngine, install_config

    calls = {}

    class LLM:
        def __init__(self, **kwargs):
            calls.update(kwargs)
            self.llm_engine = FakeLLMEngine()

        def get_tokenizer(self):
            return AutoTokenizer.from_pretrained(tiny)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=lambda **k: k))
    install_config(monkeypatch)
    sets = [f"llm.profile={tiny_profile(tmp_path, tiny)}", "llm.backend=vllm", "llm.vllm.tensor_parallel_size=2",
            "llm.vllm.gpu_memory_utilization=0.5"]
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=sets)
    llm = create_llm(config.llm)
    assert (calls["model"], calls["max_model_len"], calls["dtype"], calls["quantization"]) == (
        str(tiny), 512, "float32", None)
    assert (calls["tensor_parallel_size"], calls["gpu_memory_utilization"]) == (2, 0.5)
    assert len(llm._prompt_ids(llm.engine.get_tokenizer(), [{"role": "user", "content": LONG}])) == 128
    forced = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=[*sets, "llm.vllm.dtype=float16"])
    create_llm(forced.llm)
    assert calls["dtype"] == "float16"  # the dtype the GPU forces wins over the profile's


def test_the_fingerprint_tells_apart_folders_that_differ_in_one_tensor_and_reads_little(tmp_path, tiny):
    """Every tensor sampled through the safetensors header (whole_bytes=0: the large-file path on a small folder):
    a copy is the same weights; one tensor changed everywhere (as a merged LoRA changes a projection) is not, nor is
    a config edit; and what it reads is a small share of the folder."""
    copy = Path(shutil.copytree(tiny, tmp_path / "copy"))
    assert fingerprint(copy, whole_bytes=0)[0] == fingerprint(tiny, whole_bytes=0)[0]
    tensors = load_file(copy / "model.safetensors")
    name = "model.layers.1.self_attn.q_proj.weight"
    tensors[name] = tensors[name] + 1e-3 * torch.randn_like(tensors[name])
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    assert fingerprint(copy, whole_bytes=0)[0] != fingerprint(tiny, whole_bytes=0)[0]
    edited = Path(shutil.copytree(tiny, tmp_path / "edited"))
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "rope_theta": 10000.0}))
    assert fingerprint(edited)[0] != fingerprint(tiny)[0]
    weights = tiny / "model.safetensors"
    assert 0 < fingerprint(weights, whole_bytes=0)[1] < weights.stat().st_size / 10


def test_a_derived_profile_keeps_its_base_s_settings_with_other_weights(tmp_path, tiny):
    """What a merged fine-tune or a benchmark's folder is run under (`--set llm.profile=...`)."""
    path = write_profile(tmp_path / "merged.yaml", load_profile(), tiny)
    derived, base = load_profile(str(path)), load_profile()
    assert derived.weights_path() == tiny and derived.settings() == base.settings()


def test_serve_command_prints_what_serves_each_gpu_config_s_profile(capsys):
    from local_evaluation import main

    for name, folder in (("gpu1-llama3-8b-w4a16.yaml", "models/weights/llama3.1-8b-instruct-w4a16"),
                         ("t4x4-llama3-70b-gptq.yaml", "models/weights/llama3-70b-instruct-w4a16")):
        assert main(["serve-command", "--config", str(REPO_ROOT / "configs" / name)]) == 0
        printed = capsys.readouterr().out.split()
        config = load_config(REPO_ROOT / "configs" / name)
        assert printed[:3] == ["vllm", "serve", folder]
        assert printed[printed.index("--served-model-name") + 1] == load_profile(config.llm.profile).name
        assert f"{printed[printed.index('--port') + 1]}/v1" in config.llm.openai.base_url
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=["llm.openai.base_url=http://nowhere/v1"])
    with pytest.raises(ConfigError, match="names no host and port"):
        printed_serve_command(config)


@pytest.mark.parametrize("name", ["gpu1-llama3-8b-w4a16.yaml", "t4x4-llama3-70b-gptq.yaml"])
def test_the_how_to_s_gpu_swap_touches_one_profile_file_and_one_config_line(tmp_path, capsys, name):
    """docs/how-to/swap-the-model.md for a GPU config, as written: your own profile (the shipped one with another
    folder and name) and the config's one `llm.profile` line changed; the printed server command and the record's
    profile then name your model."""
    shipped = REPO_ROOT / "configs" / name
    base = load_profile(load_config(shipped).llm.profile)
    mine = write_profile(tmp_path / "mine.yaml", base, tmp_path / "models" / "mine", name="mine")
    lines = shipped.read_text().splitlines()
    changed = [re.sub(r"^(\s+)profile: \S+", rf"\g<1>profile: {mine}", line) for line in lines]
    assert sum(a != b for a, b in zip(lines, changed)) == 1  # one config line
    config_file = tmp_path / name
    config_file.write_text("\n".join(changed) + "\n")
    from local_evaluation import main

    assert main(["serve-command", "--config", str(config_file)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[2] == str(tmp_path / "models" / "mine")
    assert printed[printed.index("--served-model-name") + 1] == "mine"
    assert printed[printed.index("--max-model-len") + 1] == str(base.max_model_len)
    recorded = weights_of(json.loads(json.dumps(load_config(config_file).resolved()))["llm"])["profile"]
    assert recorded["name"] == "mine"


def test_a_profile_whose_weights_are_missing_is_recorded_so_and_refused_by_the_backend(tmp_path):
    profile = profile_file(tmp_path / "p.yaml", "name: x\nweights: {path: gone}\n")
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=[f"llm.profile={profile}"])
    recorded = manifest.answer_inputs(config, SAMPLE, 30.0, False)["weights"]
    assert recorded["fingerprint"].startswith("missing: ") and "weights path gone does not exist" in \
        recorded["fingerprint"]
    with pytest.raises(BackendUnavailable, match="weights path gone does not exist"):
        create_llm(config.llm)


def test_the_budget_plan_and_the_submission_checker_read_the_swapped_profile(tmp_path, tiny):
    """The planner counts no prompt over the profile's limit (every backend cuts it there); the checker's config row
    names the profile's model and its weights row checks the profile's folder."""
    from evaluation.submission.files import check_config
    from models.budget_planner import llm_stages

    profile = tiny_profile(tmp_path, tiny)
    shipped = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    swapped = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=[f"llm.profile={profile}"])
    assert max(plan.prompt_tokens for plan in llm_stages(shipped)) > 128
    assert max(plan.prompt_tokens for plan in llm_stages(swapped)) == 128
    config_file = profile_file(tmp_path / "c.yaml", (REPO_ROOT / "configs" / "cpu.yaml").read_text().replace(
        "profile: configs/models/smollm2.yaml", f"profile: {profile}"))
    row, weights, _ = check_config(REPO_ROOT, str(config_file))
    assert row.ok and f"model tiny ({profile})" in row.detail
    assert weights.ok and "paths present" in weights.detail
    shutil.rmtree(tmp_path / "gone", ignore_errors=True)
    gone = profile_file(tmp_path / "gone.yaml", f"name: tiny\nweights: {{path: {tmp_path / 'gone'}}}\n")
    config_file.write_text(config_file.read_text().replace(str(profile), str(gone)))
    _, weights, _ = check_config(REPO_ROOT, str(config_file))
    assert not weights.ok and f"{gone} weights.path" in weights.detail
