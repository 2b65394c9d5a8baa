"""VLLMBackend on a fake engine that follows vLLM's V1 engine (tests/vllm_fake.py): parameters, parallel sampling,
the deadline's abort, prompt refusal and R2AG's prompt embeddings."""

import json
import sys

import numpy as np
import pytest
import torch

from models.config import LLMConfig, VLLMConfig
from models.llm.backend import DEADLINE, LENGTH, STOP, BackendUnavailable, GenParams, cut_short
from models.llm.backends import create_llm
from models.llm.profile import ModelProfile, folder_profile, load_profile, write_profile
from models.llm.vllm import VLLMBackend, load_input_embeddings
from tests.fakes import texts
from tests.vllm_fake import FakeLLMEngine, RequestOutputKind, SamplingParams, install, model_folder
from utils.time_budget import Deadline

HI = [{"role": "user", "content": "hi"}]
HELLO = [{"role": "user", "content": "hello"}]


class Clock:
    """A clock that the fake engine advances by one second per step."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += 1.0


@pytest.fixture
def fake_vllm(monkeypatch):
    return install(monkeypatch)


@pytest.fixture
def llama(tmp_path) -> ModelProfile:
    """The profile of a Llama-like folder (tests/vllm_fake.py model_folder): the backend refuses weights that are
    not there, so even a fake engine is given a real folder."""
    return folder_profile(model_folder(tmp_path / "llama"))


def drain(engine: FakeLLMEngine) -> list:
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    return outputs


# The fake engine itself: vLLM's parallel-sampling semantics, so that the backend's tests mean something.

def test_each_output_of_a_parent_carries_one_child_and_a_finished_child_is_not_sent_again():
    engine = FakeLLMEngine(words=1)
    engine.add_request("r", {"prompt_token_ids": [1, 2]}, SamplingParams(n=3, temperature=0.7, max_tokens=8))
    outputs = drain(engine)
    assert all(output.request_id == "r" and len(output.outputs) == 1 for output in outputs)
    finished = [(o.outputs[0].index, o.outputs[0].text) for o in outputs if o.outputs[0].finish_reason]
    assert finished == [(0, " out"), (1, " red red"), (2, " sun sun sun")]  # each once
    assert [o.finished for o in outputs][-1] and not any(o.finished for o in outputs[:-1])


def test_delta_outputs_carry_only_the_new_tokens():
    engine = FakeLLMEngine(words=2)
    engine.add_request("r", {"prompt_token_ids": [1]},
                       SamplingParams(n=2, temperature=0.7, max_tokens=8, logprobs=0,
                                      output_kind=RequestOutputKind.DELTA))
    texts: dict[int, str] = {}
    for output in drain(engine):
        (choice,) = output.outputs
        assert len(choice.token_ids) == len(choice.logprobs) == 1
        texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: " out out", 1: " red red red"}


def test_final_only_emits_all_children_at_once_and_nothing_before():
    engine = FakeLLMEngine(words=1)
    engine.add_request("r", {"prompt_token_ids": [1]},
                       SamplingParams(n=3, temperature=0.7, output_kind=RequestOutputKind.FINAL_ONLY))
    (output,) = drain(engine)
    assert output.finished and [c.text for c in output.outputs] == [" out", " red red", " sun sun sun"]
    engine.add_request("s", {"prompt_token_ids": [1]},
                       SamplingParams(n=3, temperature=0.7, output_kind=RequestOutputKind.FINAL_ONLY))
    assert engine.step() + engine.step() == []  # two children done, none emitted: an abort now would lose them


def test_aborting_a_parent_aborts_its_children():
    engine = FakeLLMEngine(words=5)
    engine.add_request("r", {"prompt_token_ids": [1]}, SamplingParams(n=3, temperature=0.7))
    engine.step()
    engine.abort_request(["r"])
    assert not engine.has_unfinished_requests() and engine.step() == []


def test_the_sampled_token_is_in_its_step_s_log_probabilities_whatever_its_rank():
    engine = FakeLLMEngine(words=1)
    engine.add_request("r", {"prompt_token_ids": [1]}, SamplingParams(n=2, temperature=0.7, logprobs=1))
    choices = {o.outputs[0].index: o.outputs[0] for o in drain(engine)}
    first, second = choices[0].logprobs[0], choices[1].logprobs[0]
    assert {t: (lp.rank, lp.logprob) for t, lp in first.items()} == {100: (1, -0.1)}
    assert {t: (lp.rank, lp.logprob) for t, lp in second.items()} == {8: (1, -0.05), 101: (2, -0.2)}


def test_the_fake_sampling_params_refuse_what_vllm_refuses():
    with pytest.raises(ValueError, match="n must be 1 when using greedy sampling"):
        SamplingParams(n=3, temperature=0.0)
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        SamplingParams(max_tokens=0)
    assert SamplingParams(n=2, temperature=0.5, seed=7).child(1).kwargs == {"n": 1, "temperature": 0.5, "seed": 8}


# The backend.

def test_vllm_backend_maps_profile_config_and_params(fake_vllm, tmp_path):
    """The model (folder, quantization, length, dtype) is the profile's that llm.profile names, the hardware
    (parallelism, a dtype the GPU forces) the config's."""
    folder = model_folder(tmp_path / "llama")
    profile = tmp_path / "llama.yaml"
    profile.write_text(f"name: llama\nweights:\n  path: {folder}\nmax_model_len: 8192\nprompt_tokens: 7680\n"
                       "dtype: bfloat16\nquantization: gptq\n")
    config = LLMConfig(backend="vllm", profile=str(profile), vllm=VLLMConfig(tensor_parallel_size=4, dtype="float16"))
    llm = create_llm(config)
    init = fake_vllm["init"]
    assert (init["model"], init["quantization"], init["max_model_len"]) == (str(folder), "gptq", 8192)
    assert init["tensor_parallel_size"] == 4 and init["dtype"] == "float16"  # forced by the hardware
    assert init["enable_prompt_embeds"] is False and "tokenizer" not in init  # the folder's own
    out = llm.generate([HI, HELLO], GenParams(max_tokens=2, temperature=0.7, n=3, stop=["X"], seed=5))
    assert texts(out) == [["out out", "red red", "sun sun"]] * 2 and cut_short(out[0][0]) == LENGTH
    engine, tokenizer = fake_vllm["engine"], fake_vllm["tokenizer"]
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in ("<s> user: hi assistant:",
                                                                        "<s> user: hello assistant:")]
    assert [prompt for _, prompt, _ in engine.added] == [{"prompt_token_ids": ids[0]}, {"prompt_token_ids": ids[1]}]
    assert ids[0][0] == 1 and ids[0].count(1) == 1  # one BOS: the template's, none added
    assert engine.added[0][2] == {"n": 3, "temperature": 0.7, "max_tokens": 2, "stop": ["X"], "seed": 5,
                                  "logprobs": None}
    assert len({request_id for request_id, _, _ in engine.added}) == 2 and out[0][0].top_logprobs == ()
    assert out[0][0].tokens == out[0][0].token_logprobs == ()  # not asked for
    chosen = llm.generate([HI], GenParams(max_tokens=2, logprobs=True))[0][0]
    assert engine.added[-1][2]["logprobs"] == 0 and chosen.top_logprobs == ()
    assert (chosen.tokens, chosen.token_logprobs) == ((" out", " out"), (-0.1, -0.1))
    scored = llm.generate([HI, HELLO], GenParams(max_tokens=1, top_logprobs=2))
    assert engine.added[-1][2]["logprobs"] == 2 and scored[0][0].top_logprobs == ({" out": -0.1, " in": -2.5},)
    assert llm.generate([HI, HELLO], GenParams(deadline=Deadline(0))) == [[], []]
    assert len({request_id for request_id, _, _ in engine.added}) == 5  # ids are never reused
    assert not hasattr(llm, "generate_with_embeddings")  # R2AG prompt mode falls back (models/system.py)
    VLLMBackend(VLLMConfig(), load_profile(str(profile)))
    assert fake_vllm["init"]["dtype"] == "bfloat16"  # the config's auto leaves it to the profile


@pytest.mark.parametrize("n", [1, 3, 5])
def test_every_sample_of_n_comes_back_in_order_with_its_own_finish_reason(monkeypatch, llama, n):
    """vLLM runs n > 1 as n child requests, each output carrying one child's completion: the backend returns
    all n (child k says its word 2 + k times, or stops at max_tokens 4), with each child's log-probabilities."""
    built = install(monkeypatch, FakeLLMEngine(words=2))
    llm = VLLMBackend(VLLMConfig(), llama)
    ((*samples,), (*others,)) = llm.generate([HI, HELLO], GenParams(max_tokens=4, temperature=0.7, n=n,
                                                                    top_logprobs=1))
    expected = ["out out", "red red red", "sun sun sun sun", "ice ice ice ice", "owl owl owl owl"][:n]
    assert [s.text for s in samples] == [s.text for s in others] == expected
    assert [s.finish_reason for s in samples] == [STOP, STOP, LENGTH, LENGTH, LENGTH][:n]
    assert samples[0].top_logprobs == ({" out": -0.1},) * 2
    assert (samples[0].tokens, samples[0].token_logprobs) == ((" out",) * 2, (-0.1,) * 2)
    if n > 1:  # sampled, child 1 chose the second most likely token: not in its top 1, still its own log-prob
        assert samples[1].top_logprobs == ({" at": -0.05},) * 3
        assert (samples[1].tokens, samples[1].token_logprobs) == ((" red",) * 3, (-0.2,) * 3)
    assert not built["engine"].has_unfinished_requests()


def test_at_the_deadline_finished_children_are_kept_and_the_rest_cut_short(monkeypatch, llama, caplog_loguru):
    """Children 0 and 1 finish before the deadline (steps 1 and 2, one second each); child 2 is aborted through
    its parent and keeps its text so far as DEADLINE, which the stages read as cut short."""
    clock = Clock()
    built = install(monkeypatch, FakeLLMEngine(words=1, on_step=clock.tick))
    llm = VLLMBackend(VLLMConfig(), llama)
    out = llm.generate([HI, HELLO], GenParams(max_tokens=10, temperature=0.7, n=3, deadline=Deadline(1.5, clock)))
    assert texts(out) == [["out", "red red", "sun sun"]] * 2
    assert [s.finish_reason for s in out[0]] == [STOP, STOP, DEADLINE] and cut_short(out[0][2]) == DEADLINE
    engine = built["engine"]
    assert engine.steps == 2 and engine.aborted == ["crag-0", "crag-1"] and not engine.has_unfinished_requests()
    assert "deadline reached: 2 of 2 requests aborted" in caplog_loguru.text


def test_vllm_a_long_prompt_is_cut_to_the_profile_s_limit_its_head_and_tail_kept(fake_vllm, tmp_path,
                                                                                 caplog_loguru):
    """As the hf backend cuts: the head quarter (the instructions) and the tail (the question) of the templated ids
    stay, the middle (the references) goes, so the engine is never given a prompt over the profile's limit."""
    llm = VLLMBackend(VLLMConfig(), folder_profile(model_folder(tmp_path / "llama"), max_model_len=256,
                                                   prompt_tokens=64))
    long = [{"role": "user", "content": " ".join(f"w{i}" for i in range(100))}]
    out = llm.generate([HI, long], GenParams(max_tokens=3))
    assert texts(out) == [["out out out"]] * 2
    whole = fake_vllm["tokenizer"].apply_chat_template(long, add_generation_prompt=True, tokenize=True)
    (_, short, _), (_, cut, _) = fake_vllm["engine"].added
    assert short["prompt_token_ids"] == fake_vllm["tokenizer"].apply_chat_template(HI, add_generation_prompt=True)
    assert len(whole) == 103 and cut == {"prompt_token_ids": whole[:16] + whole[-48:]}
    assert "prompt of 103 tokens cut to 64" in caplog_loguru.text


def test_vllm_a_prompt_the_engine_refuses_costs_its_conversation_only(fake_vllm, tmp_path, caplog_loguru):
    """An R2AG prompt goes as input embeddings, which the profile's cut does not shorten: one longer than
    max_model_len is refused by the engine, and only its conversation goes without a sample."""
    llm = VLLMBackend(VLLMConfig(enable_prompt_embeds=True),
                      folder_profile(model_folder(tmp_path / "llama"), max_model_len=256, prompt_tokens=64))
    long = [{"role": "user", "content": " ".join(["word"] * 300) + f" {llm.retrieval_placeholder()}"}]
    out = llm.generate_with_embeddings([HI, long], [np.zeros((0, 8)), np.ones((1, 8))], GenParams(max_tokens=3))
    assert texts(out) == [["out out out"], []] and len(fake_vllm["engine"].added) == 1
    assert "vllm refused prompt crag-1: The decoder prompt (length 304) is longer" in caplog_loguru.text


def test_vllm_r2ag_sends_whole_prompts_as_input_embeddings(fake_vllm, tmp_path):
    """Placeholders are cut out of the template's text, the pieces tokenized and looked up in the folder's input
    embeddings, and each placeholder's position takes its retrieval vector; no placeholder: token ids."""
    folder = model_folder(tmp_path / "llama")
    llm = VLLMBackend(VLLMConfig(enable_prompt_embeds=True), folder_profile(folder))
    assert fake_vllm["init"]["enable_prompt_embeds"] is True and llm.hidden_size == 8
    mark = llm.retrieval_placeholder()
    vectors = np.arange(16, dtype=np.float32).reshape(2, 8) / 8
    conversations = [[{"role": "system", "content": "answer"}, {"role": "user", "content": f"a {mark}b c {mark}"}],
                     [{"role": "user", "content": "no references"}]]
    out = llm.generate_with_embeddings(conversations, [vectors, np.zeros((0, 8))], GenParams(max_tokens=3))
    assert texts(out) == [["out out out"]] * 2
    (_, first, _), (_, second, _) = fake_vllm["engine"].added
    tokenizer = fake_vllm["tokenizer"]
    assert second == {"prompt_token_ids": tokenizer.apply_chat_template(conversations[1], add_generation_prompt=True,
                                                                        tokenize=True)}
    assert set(first) == {"prompt_embeds"}
    embeds = first["prompt_embeds"]
    pieces = ["<s> system: answer user: a", "b c", "assistant:"]
    ids = [tokenizer.encode(piece, add_special_tokens=False) for piece in pieces]
    table = load_input_embeddings(folder)
    assert embeds.dtype == torch.bfloat16 and embeds.shape == (len(ids[0]) + 1 + len(ids[1]) + 1 + len(ids[2]), 8)
    slots = [len(ids[0]), len(ids[0]) + 1 + len(ids[1])]
    assert torch.equal(embeds[slots], torch.from_numpy(vectors).to(torch.bfloat16))
    kept = [i for i in range(len(embeds)) if i not in slots]
    assert torch.equal(embeds[kept], table[[t for piece in ids for t in piece]])


def test_vllm_r2ag_checks_counts_widths_and_the_folder(fake_vllm, tmp_path):
    folder = model_folder(tmp_path / "sharded", hidden=6, shards=2)
    llm = VLLMBackend(VLLMConfig(enable_prompt_embeds=True, dtype="float16"), folder_profile(folder))
    assert llm.hidden_size == 6  # found through the index, in the second shard
    conversation = [[{"role": "user", "content": f"x {llm.retrieval_placeholder()}"}]]
    with pytest.raises(ValueError, match="1 retrieval placeholders in the prompt, 2 embeddings"):
        llm.generate_with_embeddings(conversation, [np.ones((2, 6))], GenParams())
    with pytest.raises(ValueError, match=r"shape \(1, 4\), the model's hidden size is 6"):
        llm.generate_with_embeddings(conversation, [np.ones((1, 4))], GenParams())
    with pytest.raises(ValueError, match="1 retrieval placeholders in the prompt, 0 embeddings"):
        llm.generate_with_embeddings(conversation, [np.zeros((0, 6))], GenParams())
    llm.generate_with_embeddings(conversation, [np.ones((1, 6))], GenParams(max_tokens=1))
    assert fake_vllm["engine"].added[-1][1]["prompt_embeds"].dtype == torch.float16  # the configured dtype
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    fake_vllm.pop("init")
    with pytest.raises(BackendUnavailable, match="no model.embed_tokens.weight in its safetensors"):
        VLLMBackend(VLLMConfig(enable_prompt_embeds=True), folder_profile(bare))
    assert "init" not in fake_vllm  # refused before the engine starts


def test_the_fake_engine_refuses_embeddings_unless_enabled(fake_vllm, tmp_path):
    """The release's check, so that a backend that forgot to pass enable_prompt_embeds fails here."""
    engine = FakeLLMEngine()
    engine.engine_args = {"model": str(model_folder(tmp_path / "m"))}
    params = SamplingParams(max_tokens=1)
    with pytest.raises(ValueError, match="You must set `--enable-prompt-embeds`"):
        engine.add_request("r", {"prompt_embeds": torch.zeros(3, 8)}, params)
    engine.engine_args["enable_prompt_embeds"] = True
    with pytest.raises(RuntimeError, match="hidden size 8"):
        engine.add_request("r", {"prompt_embeds": torch.zeros(3, 5)}, params)
    engine.add_request("r", {"prompt_embeds": torch.zeros(1, 3, 8)}, params)
    assert engine.has_unfinished_requests()


def test_vllm_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(BackendUnavailable, match="vllm is not installed"):
        create_llm(LLMConfig(backend="vllm"))




# The engine's life: the engine core process stops when the model is closed or the process ends.

def test_close_stops_the_engine_core_once_and_later_calls_fail_loudly(fake_vllm, llama):
    llm = VLLMBackend(VLLMConfig(), llama)
    llm.close()
    llm.close()
    assert fake_vllm["engine"].engine_core.shutdowns == 1
    with pytest.raises(BackendUnavailable, match="shut down"):
        llm.generate([HI], GenParams(max_tokens=2))


def test_the_engine_core_stops_at_exit_unless_closed_first(fake_vllm, llama, monkeypatch):
    import atexit

    hooks = []
    monkeypatch.setattr(atexit, "register", hooks.append)
    monkeypatch.setattr(atexit, "unregister", hooks.remove)
    llm = VLLMBackend(VLLMConfig(), llama)
    assert hooks == [llm.close]
    hooks[0]()  # what the interpreter's exit does
    assert fake_vllm["engine"].engine_core.shutdowns == 1 and hooks == []


def test_the_system_closes_its_engine(fake_vllm, cpu_config, tmp_path):
    from models.system import CragSystem
    from tests.fakes import HashEmbedder

    cpu_config.llm.backend = "vllm"
    cpu_config.llm.profile = str(write_profile(tmp_path / "m.yaml", load_profile(), model_folder(tmp_path / "m")))
    system = CragSystem(cpu_config, embedder=HashEmbedder())
    system.close()
    assert fake_vllm["engine"].engine_core.shutdowns == 1


def test_a_stop_string_ends_the_sample_before_it(fake_vllm):
    """The fake cuts at a stop string as vLLM's detokenizer does (check_stop_strings)."""
    engine = FakeLLMEngine(words=5)
    engine.add_request("r", {"prompt_token_ids": [1]}, SamplingParams(n=1, temperature=0, max_tokens=9, stop=["red"]))
    engine.add_request("s", {"prompt_token_ids": [1]}, SamplingParams(n=2, temperature=0.5, max_tokens=9,
                                                                       stop=["red"]))
    last = {}
    for output in drain(engine):
        for choice in output.outputs:
            last[(output.request_id, choice.index)] = (choice.text, choice.finish_reason, choice.stop_reason)
    assert last[("r", 0)] == (" out out out out out", "stop", None)  # "red" never said: it stops by itself
    assert last[("s", 1)] == (" ", "stop", "red")  # cut before the stop string, on its first token


def test_a_lora_adapter_goes_with_every_request_at_the_engine_s_rank(fake_vllm, llama, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 12, "lora_alpha": 24}))
    llm = VLLMBackend(VLLMConfig(lora=str(adapter)), llama)
    assert fake_vllm["init"]["enable_lora"] is True and fake_vllm["init"]["max_lora_rank"] == 16  # 12 rounded up
    llm.generate([HI, HELLO], GenParams(max_tokens=2))
    loras = fake_vllm["engine"].loras
    assert len(loras) == 2 and {(r.lora_name, r.lora_int_id, r.lora_path) for r in loras} == {
        ("adapter", 1, str(adapter))}


def test_a_lora_folder_without_its_config_fails_before_the_engine_starts(fake_vllm, llama, tmp_path):
    (tmp_path / "adapter").mkdir()
    with pytest.raises(BackendUnavailable, match="no readable adapter_config.json"):
        VLLMBackend(VLLMConfig(lora=str(tmp_path / "adapter")), llama)
    assert "init" not in fake_vllm


def test_the_fake_engine_refuses_a_lora_request_unless_lora_is_enabled():
    """The release's check (input_processor.py _validate_lora), so a backend that forgot enable_lora fails here."""
    from tests.vllm_fake import LoRARequest

    engine = FakeLLMEngine()
    engine.engine_args = {"model": "/w/llama"}
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        engine.add_request("r", {"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=1),
                           lora_request=LoRARequest("a", 1, "/a"))
    with pytest.raises(ValueError, match="id must be > 0"):
        LoRARequest("a", 0, "/a")


def test_a_folder_the_engine_would_read_with_another_rope_is_refused_before_it_starts(fake_vllm, tmp_path):
    """Qwen2.5's yarn RoPE saved by transformers 5: the engine (under 4.57) would take base 10000; refused before
    vllm.LLM is built, then served once made portable."""
    from tests.model_families import write
    from utils.model_folders import FolderError, portable_folder

    folder = write(tmp_path, "qwen2.5")
    with pytest.raises(FolderError, match=r"rope_theta is 1000000.0 in rope_parameters .*/model_folder.py portable"):
        VLLMBackend(VLLMConfig(), folder_profile(folder))
    assert "init" not in fake_vllm
    portable_folder(folder)
    VLLMBackend(VLLMConfig(), folder_profile(folder))
    assert fake_vllm["init"]["model"] == str(folder)
