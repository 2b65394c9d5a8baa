"""models/llm/vllm.py on the real engine (vLLM's CPU build of the pinned release, SmolLM2), and the fake
(tests/vllm_fake.py) held to it: every scenario of tests/vllm_scenarios.py must give the same summary on both."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.config import VLLMConfig
from models.llm.backend import STOP, GenParams
from models.llm.vllm import VLLMBackend, load_input_embeddings
from tests import vllm_fake
from tests.vllm.conftest import MAX_MODEL_LEN
from tests.vllm_scenarios import EXPECTED, SCENARIOS, SHORT, STORY, WORDS, StepClock

TOO_LONG = MAX_MODEL_LEN + 100  # words, each at least one token
# Teacher forcing in transformers (float32, torch's attention) against the engine's float32 CPU kernels: the two
# sum in other orders, so they agree to rounding, not bit for bit.
LOGPROB_TOLERANCE = 2e-3


def run(name: str, llm, clock) -> list:
    scenario = SCENARIOS[name]
    return scenario(llm, clock, TOO_LONG) if name == "refused" else scenario(llm, clock)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_fake_and_the_real_engine_agree(name, real, smollm2, monkeypatch):
    backend, clock = real
    found_real = run(name, backend, clock)
    engine = vllm_fake.FakeLLMEngine(words=WORDS[name])
    vllm_fake.install(monkeypatch, engine)
    fake = VLLMBackend(VLLMConfig(model=str(smollm2), max_model_len=MAX_MODEL_LEN))
    found_fake = run(name, fake, StepClock(engine))
    assert found_real == found_fake == EXPECTED[name]


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
