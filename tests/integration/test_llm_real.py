"""The hf backend on the embedded SmolLM2, and the openai backend against a real `transformers serve`.

The deadline tests run on model time (ModelTime): a clock that the model's own forward passes move, read by the
backend's timing and by the test's deadline alike. What the deadline admits, cuts and stops then depends on the
tokens the model reads, never on how busy the machine is; how fast the real machine meets its deadlines is
measured by `make bench` (benchmarks/deadline.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator

import pytest
import torch

from models.config import OpenAIConfig
from models.llm.backend import DEADLINE, LENGTH, STOP, GenParams, cut_short
from models.llm.hf import MIN_PROMPT_TOKENS, PREFILL_CHUNK_MAX, PREFILL_SHARE, HFBackend, _new_tokens
from models.llm.openai import OpenAIBackend
from models.llm.profile import ModelProfile
from utils.time_budget import Deadline

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
OTHER = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a primary color."}]
LONG = [{"role": "user", "content": "The harbour reported record traffic this season. " * 250 + "Sum 2 and 2."}]
COUNT = [{"role": "user", "content": "Count from 1 to 1000, one number after another, separated by commas."}]
NEVER_S = 3600.0  # a deadline no call here comes near: it only turns the deadline's code paths on


def served(model: str) -> ModelProfile:
    """The profile of the model `transformers serve` serves under `model` (its folder's path), as a server's: no
    weights here, so no prompt is cut on this side."""
    return ModelProfile(name=model, weights=None)


class ModelTime:
    """A clock moved by the model's forward passes: each takes its tokens (positions x rows) / `rate` seconds.
    `passes` holds the tokens of every pass, in order."""

    def __init__(self, rate: float) -> None:
        self.rate, self.now = rate, 0.0
        self.passes: list[int] = []

    def __call__(self) -> float:
        return self.now

    def after_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        tokens = _new_tokens(kwargs)
        self.passes.append(tokens)
        self.now += tokens / self.rate


@pytest.fixture
def model_time(hf_llm: HFBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[float, float], ModelTime]]:
    """Put the backend on model time reading `rate` tokens/s, with `measured` as the rate it measured at load and
    no decoding step timed yet; the backend's rates and clock are restored after the test."""
    hooks = []

    def start(rate: float, measured: float) -> ModelTime:
        clock = ModelTime(rate)
        monkeypatch.setattr(hf_llm, "_now", clock)
        monkeypatch.setattr(hf_llm, "_prefill_tps", measured)
        monkeypatch.setattr(hf_llm, "_step_s", 0.0)
        hooks.append(hf_llm.model.register_forward_hook(clock.after_forward, with_kwargs=True))
        return clock

    yield start
    for hook in hooks:
        hook.remove()


@pytest.fixture
def encoded(hf_llm: HFBackend, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (rows, width) of every batch the backend encodes, in order."""
    shapes: list[tuple[int, int]] = []
    encode = hf_llm._encode

    def recording(*args: object, **kwargs: object) -> dict[str, torch.Tensor]:
        inputs = encode(*args, **kwargs)
        shapes.append(tuple(inputs["attention_mask"].shape))
        return inputs

    monkeypatch.setattr(hf_llm, "_encode", recording)
    return shapes


def prompt_length(llm: HFBackend, conversation: list[dict[str, str]]) -> int:
    return len(llm.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_dict=True)
               ["input_ids"])


def test_hf_generates_a_batch_greedily(hf_llm):
    out = hf_llm.generate([QUESTION, OTHER], GenParams(max_tokens=16))
    assert len(out) == 2 and all(len(samples) == 1 and samples[0].text for samples in out)
    assert "paris" in out[0][0].text.lower()
    assert hf_llm.generate([OTHER, QUESTION], GenParams(max_tokens=16)) == out[::-1]  # left padding is harmless


def test_hf_samples_n_and_stops(hf_llm):
    out = hf_llm.generate([QUESTION], GenParams(max_tokens=24, temperature=1.0, n=3, seed=0))
    assert len(out[0]) == 3
    stopped = hf_llm.generate([QUESTION], GenParams(max_tokens=24, stop=["Paris"]))[0][0]
    assert "Paris" not in stopped.text


def test_hf_says_why_generation_ended(hf_llm):
    ((finished,),) = hf_llm.generate([QUESTION], GenParams(max_tokens=48))
    ((cut,),) = hf_llm.generate([OTHER], GenParams(max_tokens=2))
    assert cut_short(finished) is None and cut_short(cut) == LENGTH
    ((stopped,),) = hf_llm.generate([QUESTION], GenParams(max_tokens=48, stop=["Paris"]))
    assert cut_short(stopped) is None  # a stop string ends it as the model's end of sequence does


def test_hf_stops_decoding_within_one_step_of_the_deadline(hf_llm, model_time):
    """100 tokens/s of model time: the prompt takes about 0.5 s of the deadline and each decoding step 0.01 s, so
    counting to 1,000 is cut by the deadline after about 50 tokens, before a step that would end past it. The
    deadline falls between two steps' ends, so a step too many ends past it."""
    clock = model_time(rate=100.0, measured=100.0)
    seconds, step = 1.005, 1 / clock.rate  # one row: a step reads one position
    ((timed_out,),) = hf_llm.generate([COUNT], GenParams(max_tokens=2000, deadline=Deadline(seconds, clock)))
    assert timed_out and cut_short(timed_out) == DEADLINE
    assert prompt_length(hf_llm, COUNT) + 10 < sum(clock.passes) < prompt_length(hf_llm, COUNT) + seconds * clock.rate
    assert seconds - 2 * step < clock.now <= seconds  # not past the deadline, and not a step earlier than needed


def test_hf_cuts_the_prompts_to_what_the_deadline_affords(hf_llm, model_time, encoded):
    """Four ~2,000-token prompts, 3 s at a measured 1,000 tokens/s: PREFILL_SHARE of it reads 1,200 tokens, so each
    prompt is cut to 300 (head and tail), and the generation ends within the deadline at the rate it planned with."""
    clock = model_time(rate=1000.0, measured=1000.0)
    out = hf_llm.generate([LONG] * 4, GenParams(max_tokens=32, deadline=Deadline(3.0, clock)))
    affordable = 1000.0 * 3.0 * PREFILL_SHARE
    assert len(out) == 4 and all(len(samples) == 1 for samples in out)
    rows, width = encoded[-1]
    assert rows == 4 and width == int(affordable / 4) < prompt_length(hf_llm, LONG)
    assert sum(tokens for tokens in clock.passes if tokens > rows) <= affordable  # the chunks; decoding reads 1 a row
    assert clock.now <= 3.0


def test_hf_does_not_encode_prompts_the_deadline_cannot_read(hf_llm, model_time, encoded, caplog_loguru):
    """Templating and tokenising long prompts takes time too (eight 3,000-token prompts: 0.08 s, which made a
    batch overrun a 1.5 s deadline): a micro-batch that cannot read MIN_PROMPT_TOKENS each is given up first, while
    a short prompt still goes."""
    clock = model_time(rate=100.0, measured=100.0)  # 3 s reads 120 tokens: 30 a prompt
    assert 100.0 * 3.0 * PREFILL_SHARE / 4 < MIN_PROMPT_TOKENS
    assert hf_llm.generate([LONG] * 4, GenParams(max_tokens=32, deadline=Deadline(3.0, clock))) == [[]] * 4
    assert encoded == [] and clock.passes == [] and "4 conversations not generated" in caplog_loguru.text
    ((short,),) = hf_llm.generate([QUESTION], GenParams(max_tokens=4, deadline=Deadline(3.0, clock)))
    assert short and len(encoded) == 1


def test_hf_gives_up_reading_prompts_the_deadline_cannot_afford(hf_llm, model_time, encoded, caplog_loguru):
    """A rate measured on a quieter machine (here 20 times the real one) admits prompts that now take far longer to
    read: the prompts are read in chunks, the chunk the deadline cannot afford is not started, and the next call
    plans with the rate this one saw."""
    clock = model_time(rate=100.0, measured=2000.0)
    out = hf_llm.generate([LONG] * 4, GenParams(max_tokens=32, deadline=Deadline(3.0, clock)))
    assert out == [[]] * 4 and "4 rows given up while reading their prompts" in caplog_loguru.text
    # admitted at 20 times the rate: 2,400 tokens, 600 a prompt, read in chunks of 128 positions x 4 rows
    assert encoded[-1] == (4, int(2000.0 * 3.0 * PREFILL_SHARE / 4))
    chunk = PREFILL_CHUNK_MAX  # planned 250 positions a row, capped at PREFILL_CHUNK_MAX // 4
    assert clock.passes == [chunk]  # 5.12 s for the first: the second is not started
    assert clock.now <= 3.0 + chunk / clock.rate  # at most one chunk past the deadline
    assert hf_llm._prefill_tps == pytest.approx(clock.rate)  # learned from the chunk it read


def test_hf_respects_the_deadline(hf_llm, encoded):
    assert hf_llm.generate([QUESTION, OTHER], GenParams(deadline=Deadline(0))) == [[], []]
    assert encoded == []


def test_hf_gives_the_log_probabilities_of_each_token(hf_llm):
    ((plain,), (other,)) = hf_llm.generate([QUESTION, OTHER], GenParams(max_tokens=8))
    ((scored,), (other_scored,)) = hf_llm.generate([QUESTION, OTHER], GenParams(max_tokens=8, top_logprobs=3))
    assert (scored.text, other_scored.text) == (plain.text, other.text) and plain.top_logprobs == ()  # same text
    for sample in (scored, other_scored):
        assert 0 < len(sample.top_logprobs) <= 8 and all(len(step) == 3 for step in sample.top_logprobs)
        for step in sample.top_logprobs:
            assert all(lp <= 0 for lp in step.values()) and sum(math.exp(lp) for lp in step.values()) <= 1 + 1e-4
        first = max(sample.top_logprobs[0], key=sample.top_logprobs[0].get)
        assert sample.text.startswith(first.strip())  # greedy: the text begins with the most likely first token


def test_hf_gives_the_chosen_tokens_log_probabilities_greedy_and_sampled(hf_llm):
    """The generated tokens with their log-probabilities under the model's own distribution, read again here by
    one forward pass over the prompt and the tokens (teacher forcing): greedy, each is the step's most likely;
    sampled at temperature 1.5, they come from where sampling went, which need not be the top."""
    prompt = hf_llm.tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, return_tensors="pt",
                                                  return_dict=True)["input_ids"]
    compared = 0
    for params in (GenParams(max_tokens=8, logprobs=True, top_logprobs=1),
                   GenParams(max_tokens=8, logprobs=True, temperature=1.5, n=3)):
        (samples,) = hf_llm.generate([QUESTION], params)
        for sample in samples:
            assert sample.tokens and len(sample.tokens) == len(sample.token_logprobs) <= 8
            assert "".join(sample.tokens).strip().startswith(sample.text.strip()[:10])
            each = [hf_llm.tokenizer(token, add_special_tokens=False)["input_ids"] for token in sample.tokens]
            if all(len(token_ids) == 1 for token_ids in each):  # each decoded token encodes back to one id
                ids = torch.tensor([[token_ids[0] for token_ids in each]])
                with torch.no_grad():
                    logits = hf_llm.model(torch.cat([prompt, ids], dim=1)).logits[0, prompt.shape[1] - 1:-1]
                expected = logits.float().log_softmax(-1).gather(-1, ids[0].unsqueeze(-1)).squeeze(-1)
                assert torch.allclose(expected, torch.tensor(sample.token_logprobs), atol=2e-3)
                compared += 1
            if params.temperature == 0:
                best = [max(step.values()) for step in sample.top_logprobs]
                assert sample.token_logprobs == pytest.approx(best, abs=1e-5)
    assert compared >= 2  # greedy and at least one sampled answer were read again


def test_openai_backend_gets_no_log_probabilities_from_transformers_serve(served_model):
    base_url, model, _ = served_model  # transformers serve ignores logprobs (it logs "unsupported fields")
    backend = OpenAIBackend(OpenAIConfig(base_url=base_url), served(model))
    ((sample,),) = backend.generate([QUESTION], GenParams(max_tokens=8, top_logprobs=3, deadline=Deadline(NEVER_S)))
    assert sample and sample.top_logprobs == () and not backend.logprobs_refused


def test_hf_cache_is_a_plain_folder(hf_llm):
    assert (hf_llm.folder / "model.safetensors").is_file() and (hf_llm.folder / "config.json").is_file()
    assert "quantization_config" not in (hf_llm.folder / "config.json").read_text()


def test_openai_backend_talks_to_transformers_serve(served_model):
    base_url, model, log = served_model
    backend = OpenAIBackend(OpenAIConfig(base_url=base_url, concurrency=2), served(model))
    out = backend.generate([QUESTION, OTHER], GenParams(max_tokens=16, stop=["."], deadline=Deadline(NEVER_S)))
    assert all(len(samples) == 1 and samples[0].text and "." not in samples[0].text for samples in out)
    assert "paris" in out[0][0].text.lower()
    assert log.read_text().count("POST /v1/chat/completions") >= 2
    ((cut,),) = backend.generate([OTHER], GenParams(max_tokens=1, deadline=Deadline(NEVER_S)))
    assert cut_short(cut) == LENGTH  # the server's finish_reason "length"


def test_the_converted_folder_names_a_tokenizer_class_transformers_4_knows(hf_llm):
    """The submission's vLLM runs on transformers 4, which has no TokenizersBackend (tests/vllm loads the folder
    there); transformers 5 reads the class written instead as the same tokenizer."""
    from transformers import AutoTokenizer

    config = json.loads((hf_llm.folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert AutoTokenizer.from_pretrained(hf_llm.folder)("Paris")["input_ids"] == hf_llm.tokenizer("Paris")["input_ids"]


COLOURS = [{"role": "user", "content": "Name the three primary colours in one sentence."}]


def test_the_scripted_fake_generates_as_the_hf_backend_does(hf_llm):
    """tests/fakes.py ScriptedLLM, scripted with the model's own whole reply, held to the hf backend on the same
    parameters: a max_tokens under the reply ends both with LENGTH on a prefix of it; a stop string in the reply
    cuts both at the same place with STOP; a whole reply ends both with the reply's own end; a deadline already
    passed serves neither. (The fake's tokens are words, the model's are BPE pieces: the prefixes differ in length,
    not in kind.)"""
    from tests.fakes import ScriptedLLM

    (whole,) = hf_llm.generate([COLOURS], GenParams(max_tokens=160))[0]
    assert whole.finish_reason == STOP and len(whole.text.split()) > 5, whole
    fake = ScriptedLLM(lambda conversation: whole.text)
    word = whole.text.split()[3]
    for params in (GenParams(max_tokens=3), GenParams(max_tokens=160, stop=[word]), GenParams(max_tokens=160),
                   GenParams(max_tokens=3, n=2), GenParams(deadline=Deadline(0))):
        real, scripted = hf_llm.generate([COLOURS], params), fake.generate([COLOURS], params)
        assert [len(samples) for samples in real] == [len(samples) for samples in scripted], params
        for mine, theirs in zip(scripted[0], real[0]):
            assert mine.finish_reason == theirs.finish_reason, params
            assert whole.text.startswith(mine.text) and whole.text.startswith(theirs.text), params
            if params.stop or params.max_tokens == 160:
                assert mine.text == theirs.text, params
    assert real == [[]]  # the deadline case, last
