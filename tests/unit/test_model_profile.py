"""The model profile (configs/models/default.yaml, models/llm/profile.py): one file says which model runs, how it is
served and where prompts are cut; swapping it swaps the model everywhere the project runs one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from evaluation import manifest
from evaluation.llm_server import serve_command
from models.config import REPO_ROOT, ConfigError, HFConfig
from models.llm.backend import FAILED, BackendUnavailable, GenParams
from models.llm.backends import create_llm
from models.llm.hf import resolve_model_folder
from models.llm.openai import OpenAIBackend
from models.llm.profile import DEFAULT_PROFILE, load_profile, served_config
from models.loading import load_config
from tests.conftest import SAMPLE
from tests.openai_fake import ChatServer
from utils.model_folders import weights_hash

LONG = " ".join(f"reference{i} says the answer is {i}." for i in range(400))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A Llama of two layers made at random, with the default model's tokenizer and chat template."""
    folder = tmp_path_factory.mktemp("tiny")
    default = resolve_model_folder(HFConfig())
    tokenizer = AutoTokenizer.from_pretrained(default)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=1024, bos_token_id=tokenizer.bos_token_id,
                                         eos_token_id=tokenizer.eos_token_id))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def profile_file(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def tiny_profile(tmp_path: Path, folder: Path) -> Path:
    return profile_file(tmp_path / "tiny.yaml", f"name: tiny\nweights:\n  path: {folder}\nprompt_tokens: 128\n"
                                                "serve:\n  dtype: float32\n  max_model_len: 512\n")


def test_the_default_profile_is_the_embedded_smollm2():
    profile = load_profile()
    assert profile.name == "smollm2" and profile.weights_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert load_config(REPO_ROOT / "configs" / "cpu.yaml").llm.profile == DEFAULT_PROFILE
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert f"sed -n 's/^ *install: *\\([^ #]*\\).*/\\1/p' {DEFAULT_PROFILE}" in makefile  # make setup installs it


@pytest.mark.parametrize("text,said", [
    ("name: x\nweights: {path: m, package: p, file: f}\n", "give either path, or package and file"),
    ("name: x\nweights: {path: m}\nprompt_tokens: 4096\n", "leaves no room for a reply"),
    ("name: x\nweights: {path: m}\nprompt_tokns: 10\n", "prompt_tokns"),
    ("name: x\nweights: {path: m}\nserve: {dtype: int8}\n", "serve.dtype"),
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
    assert llm.folder == tiny and llm.config.max_input_tokens == 128
    ids, _ = llm.prompt_ids([{"role": "user", "content": LONG}])
    assert len(ids) == 128
    (sample,), = llm.generate([[{"role": "user", "content": LONG}]], GenParams(max_tokens=3))
    assert sample.text is not None  # a random model answers nonsense, but it answers

    recorded = manifest.answer_inputs(config, SAMPLE, 30.0, False)["weights"]  # a run's setup names it
    assert recorded["weights"] == weights_hash(tiny) and recorded["profile"]["name"] == "tiny"
    assert "converter" not in recorded  # a folder, not a converted .gguf

    command = serve_command(tiny, profile, 8000)  # --serve-llm serves it under its name, dtype and length
    assert command[command.index("--served-model-name") + 1] == "tiny"
    assert command[command.index("--dtype") + 1] == "float32"
    assert command[command.index("--max-model-len") + 1] == "512"
    served = served_config(config, profile, "http://127.0.0.1:1/v1", str(tiny)).llm.openai
    assert (served.model, served.max_input_tokens, served.tokenizer) == ("tiny", 128, str(tiny))
    # as many requests in flight as the engine runs: a request's timeout does not count the queue before it
    assert served.concurrency == int(command[command.index("--max-num-seqs") + 1]) == 1
    served_record = manifest.answer_inputs(config, SAMPLE, 30.0, False, served_llm=True)["config"]["llm"]["openai"]
    assert served_record["model"] == "tiny" and served_record["max_input_tokens"] == 128


def test_the_openai_backend_cuts_a_prompt_the_server_would_refuse(tmp_path, tiny):
    """The profile's prompt limit in the openai backend: the served model (the fake follows vLLM's length check)
    refuses an over-long prompt, and gets it cut as the hf backend cuts, its question kept."""
    tokenizer = AutoTokenizer.from_pretrained(tiny)

    def count(messages):
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"])

    server = ChatServer(max_model_len=512, count_tokens=count, answer_with=lambda body: "ok")
    profile = load_profile(str(tiny_profile(tmp_path, tiny)))
    conversation = [{"role": "system", "content": "Answer briefly."},
                    {"role": "user", "content": LONG + " Question: what is the answer?"}]
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    uncut = OpenAIBackend(replace(config.llm.openai, base_url=server.url, model="tiny"))
    (refused,), = uncut.generate([conversation], GenParams(max_tokens=8))  # HTTP 400: a failed call, no answer
    assert refused.finish_reason == FAILED and "maximum context length" in refused.failure
    cut = OpenAIBackend(served_config(config, profile, server.url, str(tiny)).llm.openai)
    (sample,), = cut.generate([conversation], GenParams(max_tokens=8))
    assert sample.text == "ok"
    sent = server.requests[-1]["body"]["messages"]
    assert count(sent) <= 128 and sent[0] == conversation[0]
    assert sent[1]["content"].endswith("Question: what is the answer?")  # the tail, with the question, stays


def test_a_profile_whose_weights_are_missing_is_recorded_so_and_refused_by_the_backend(tmp_path):
    profile = profile_file(tmp_path / "p.yaml", "name: x\nweights: {path: gone}\n")
    config = load_config(REPO_ROOT / "configs" / "cpu.yaml", sets=[f"llm.profile={profile}"])
    recorded = manifest.answer_inputs(config, SAMPLE, 30.0, False)["weights"]
    assert recorded["weights"].startswith("missing: ") and "weights path gone does not exist" in recorded["weights"]
    with pytest.raises(BackendUnavailable, match="weights path gone does not exist"):
        create_llm(config.llm)
