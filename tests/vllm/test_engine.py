"""models/llm/vllm.py on the real engine (vLLM's CPU build of the pinned release, SmolLM2), and the fake
(tests/vllm_fake.py) held to it: every scenario of tests/vllm_scenarios.py must give the same summary on both."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.config import VLLMConfig
from models.llm.backend import LENGTH, STOP, GenParams
from models.llm.vllm import VLLMBackend, load_input_embeddings
from tests import vllm_fake
from tests.vllm.conftest import MAX_MODEL_LEN, PROMPT_TOKENS, profile
from tests.vllm_scenarios import EXPECTED, POEM, SCENARIOS, SHORT, STORY, WORDS, StepClock

TOO_LONG = MAX_MODEL_LEN + 100  # words, each at least one token
# Teacher forcing in transformers (float32, torch's attention) against the engine's float32 CPU kernels: the two
# sum in other orders, so they agree to rounding, not bit for bit.
LOGPROB_TOLERANCE = 2e-3


def fake_backend(monkeypatch, smollm2, name: str, **engine) -> tuple[VLLMBackend, StepClock]:
    """VLLMBackend on the fake engine scripted for the scenario `name`, at the real one's profile, and its clock."""
    fake = vllm_fake.FakeLLMEngine(words=WORDS[name])
    vllm_fake.install(monkeypatch, fake)
    return VLLMBackend(VLLMConfig(**engine), profile(smollm2)), StepClock(fake)


# "over_long" takes the length of its prompt; it has its own test below.
@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - {"over_long"}))
def test_the_fake_and_the_real_engine_agree(name, real, smollm2, monkeypatch):
    backend, clock = real
    found_real = SCENARIOS[name](backend, clock)
    found_fake = SCENARIOS[name](*fake_backend(monkeypatch, smollm2, name))
    assert found_real == found_fake == EXPECTED[name]


def test_a_token_prompt_over_the_engine_s_length_is_cut_and_answered_on_both_engines(real, smollm2, monkeypatch):
    """The "over_long" scenario's prompt of TOO_LONG words goes cut to the profile's prompt_tokens (its head and
    tail kept), so neither engine refuses it: every conversation gets its sample. (What SmolLM2 says to a cut run of
    one word is its own: it may end at once.)"""
    backend, clock = real
    found_real = SCENARIOS["over_long"](backend, clock, TOO_LONG)
    found_fake = SCENARIOS["over_long"](*fake_backend(monkeypatch, smollm2, "over_long"), TOO_LONG)
    for found in (found_real, found_fake):
        assert found[0] == found[2] == [(LENGTH, True)] and len(found[1]) == 1, found
    long = [{"role": "user", "content": "word " * TOO_LONG}]
    assert len(backend._prompt_ids(backend.engine.get_tokenizer(), long)) == PROMPT_TOKENS


def refused_embeds(llm, too_long: int) -> list:
    """An R2AG prompt of `too_long` words and one placeholder, between two token prompts: it goes as input
    embeddings, which the prompt cut does not shorten."""
    long = [{"role": "user", "content": "word " * too_long + llm.retrieval_placeholder()}]
    none = np.zeros((0, llm.hidden_size), dtype=np.float32)
    rows = [none, np.zeros((1, llm.hidden_size), dtype=np.float32), none]
    result = llm.generate_with_embeddings([SHORT, long, POEM], rows, GenParams(max_tokens=3))
    return [[(s.finish_reason, bool(s.text.strip())) for s in conversation] for conversation in result]


def test_a_prompt_the_engine_refuses_costs_its_conversation_only_on_both_engines(real, smollm2, monkeypatch):
    """Input embeddings over max_model_len: both engines refuse the prompt, which gets no sample, and answer the
    others (EXPECTED["refused"])."""
    backend, _ = real
    found_real = refused_embeds(backend, TOO_LONG)
    fake, _ = fake_backend(monkeypatch, smollm2, "refused", enable_prompt_embeds=True)
    assert found_real == refused_embeds(fake, TOO_LONG) == EXPECTED["refused"]


def spy_outputs(monkeypatch, engine) -> dict:
    """The token ids each request finished with, as the engine's RequestOutputs carried them."""
    ids: dict[tuple[str, int], list[int]] = {}
    step = engine.step

    def spied():
        outputs = step()
        for output in outputs:
            for choice in output.outputs:
                ids[(output.request_id, choice.index)] = list(choice.token_ids)
        return outputs

    monkeypatch.setattr(engine, "step", spied)
    return ids


def test_log_probabilities_are_transformers_log_softmax_at_the_same_tokens(real, smollm2, monkeypatch):
    """The backend's chosen-token log-probabilities against teacher forcing of the same model in the
    submission's transformers, token by token."""
    from transformers import AutoModelForCausalLM

    backend, _ = real
    tokenizer = backend.engine.get_tokenizer()
    ids = spy_outputs(monkeypatch, backend.engine.llm_engine)
    samples = backend.generate([SHORT, STORY], GenParams(max_tokens=12, logprobs=True))
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    generated = [ids[key] for key in sorted(ids, key=lambda k: int(k[0].split("-")[1]))]
    for conversation, [sample], gen in zip([SHORT, STORY], samples, generated):
        prompt = list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True))
        with torch.no_grad():
            logits = model(torch.tensor([prompt + gen])).logits[0].float()
        forced = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)[torch.arange(len(gen)), torch.tensor(gen)]
        assert len(sample.token_logprobs) == len(gen) > 0
        np.testing.assert_allclose(sample.token_logprobs, forced.numpy(), atol=LOGPROB_TOLERANCE)
        assert sample.tokens == tuple(tokenizer.decode([t]) for t in gen)


def test_prompt_embeddings_of_the_model_s_own_rows_give_the_token_prompt_s_greedy_text(real, smollm2):
    """R2AG's prompt mode through the real EmbedsPrompt: the question's tokens sent as rows of the model's input
    embeddings, one retrieval placeholder each, decode as the same question sent as token ids."""
    backend, _ = real
    tokenizer = backend.engine.get_tokenizer()
    question = SHORT[0]["content"]
    ids = tokenizer.encode(question, add_special_tokens=False)
    mark = backend.retrieval_placeholder()
    as_rows = [{"role": "user", "content": mark * len(ids)}]
    # the template cuts around the placeholders where it cuts around the question: the same ids either way
    table = load_input_embeddings(smollm2, "float32")
    whole = tokenizer.apply_chat_template(SHORT, add_generation_prompt=True, tokenize=True)
    pieces = tokenizer.apply_chat_template(as_rows, add_generation_prompt=True, tokenize=False).split(mark)
    assert list(whole) == (tokenizer.encode(pieces[0], add_special_tokens=False) + ids
                           + tokenizer.encode(pieces[-1], add_special_tokens=False))
    params = GenParams(max_tokens=16)
    [[by_ids]] = backend.generate([SHORT], params)
    [[by_rows]] = backend.generate_with_embeddings([as_rows], [table[ids].numpy()], params)
    assert by_ids.text and by_rows.text == by_ids.text and by_rows.finish_reason == by_ids.finish_reason == STOP
