"""The hf backend on the embedded SmolLM2, and the openai backend against a real `transformers serve`."""

import math
import time

from utils.deadline import Deadline
from models.config import OpenAIConfig
from models.llm.base import DEADLINE, LENGTH, GenParams, cut_short
from models.llm.hf import PREFILL_SHARE
from models.llm.openai import OpenAIBackend

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
OTHER = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a primary color."}]


def test_hf_generates_a_batch_greedily(hf_llm):
    out = hf_llm.generate([QUESTION, OTHER], GenParams(max_tokens=16))
    assert len(out) == 2 and all(len(samples) == 1 and samples[0] for samples in out)
    assert "paris" in out[0][0].lower()
    assert hf_llm.generate([OTHER, QUESTION], GenParams(max_tokens=16)) == out[::-1]  # left padding is harmless


def test_hf_samples_n_and_stops(hf_llm):
    out = hf_llm.generate([QUESTION], GenParams(max_tokens=24, temperature=1.0, n=3, seed=0))
    assert len(out[0]) == 3
    stopped = hf_llm.generate([QUESTION], GenParams(max_tokens=24, stop=["Paris"]))[0][0]
    assert "Paris" not in stopped


def test_hf_says_why_generation_ended(hf_llm):
    ((finished,),) = hf_llm.generate([QUESTION], GenParams(max_tokens=48))
    ((cut,),) = hf_llm.generate([OTHER], GenParams(max_tokens=2))
    assert cut_short(finished) is None and cut_short(cut) == LENGTH
    ((stopped,),) = hf_llm.generate([QUESTION], GenParams(max_tokens=48, stop=["Paris"]))
    assert cut_short(stopped) is None  # a stop string ends it as the model's end of sequence does
    # a deadline that affords reading the prompt (even on a busy machine) but not 2,000 tokens of counting
    count = [{"role": "user", "content": "Count from 1 to 1000, one number after another, separated by commas."}]
    ((timed_out,),) = hf_llm.generate([count], GenParams(max_tokens=2000, deadline=Deadline(6.0)))
    assert timed_out and cut_short(timed_out) == DEADLINE  # the deadline clock stopped it


def test_hf_reads_no_more_of_the_prompts_than_the_deadline_affords(hf_llm):
    """Reading a prompt is one forward pass that no stopping criterion can stop (four 2,000-token prompts: about 15 s on
    two cores): the backend cuts the prompts to what the deadline affords at its measured rate, or does not
    start them. A contract with a generous margin, not a speed figure."""
    long = [{"role": "user", "content": "The harbour reported record traffic this season. " * 250 + "Sum 2 and 2."}]
    started = time.perf_counter()
    out = hf_llm.generate([long] * 4, GenParams(max_tokens=32, deadline=Deadline(3.0)))
    assert time.perf_counter() - started < 3.0 + 2.0 and len(out) == 4
    started = time.perf_counter()
    assert hf_llm.generate([long] * 4, GenParams(max_tokens=32, deadline=Deadline(0.2))) == [[]] * 4
    assert time.perf_counter() - started < 1.0


def test_hf_gives_up_reading_prompts_the_deadline_cannot_afford(hf_llm):
    """A rate measured on a quieter machine admits prompts that now take far longer to read (four 2,000-token
    prompts: about 15 s on two cores): the prompts are read in chunks, and the chunk the deadline cannot afford is
    not started. A contract with a generous margin, not a speed figure."""
    long = [{"role": "user", "content": "The harbour reported record traffic this season. " * 250 + "Sum 2 and 2."}]
    measured = hf_llm._prefill_tps
    hf_llm._prefill_tps = 20 * measured  # as if the machine had been 20 times faster when it was measured
    try:
        started = time.perf_counter()
        out = hf_llm.generate([long] * 4, GenParams(max_tokens=32, deadline=Deadline(3.0)))
        seconds = time.perf_counter() - started
        learned = hf_llm._prefill_tps
    finally:
        hf_llm._prefill_tps = measured
    # Admitted, the prompts are cut to what 20 times the rate reads in 40% of 3 s, which takes up to 24 s at the
    # real rate. One chunk (at most 512 tokens) may run past the deadline: the bound is in chunks at the rate
    # measured before, so a busier machine does not fail the test, and it is far below reading them all.
    length = min(len(hf_llm.tokenizer.apply_chat_template(long, add_generation_prompt=True, return_dict=True)["input_ids"]),
                 hf_llm.config.max_input_tokens)
    chunk_s, whole_s = 512 / measured, min(4 * length, 20 * measured * 3.0 * PREFILL_SHARE) / measured
    assert out == [[]] * 4 and seconds < 3.0 + 2 * chunk_s < whole_s
    # the next call plans with what this one saw, near the real rate (measured again: the session's measurement
    # may come from a busier moment), not the inflated one
    assert learned < 2 * max(measured, hf_llm._measure_prefill()) < 20 * measured


def test_hf_respects_the_deadline(hf_llm):
    assert hf_llm.generate([QUESTION, OTHER], GenParams(deadline=Deadline(0))) == [[], []]


def test_hf_gives_the_log_probabilities_of_each_token(hf_llm):
    ((plain,), (other,)) = hf_llm.generate([QUESTION, OTHER], GenParams(max_tokens=8))
    ((scored,), (other_scored,)) = hf_llm.generate([QUESTION, OTHER], GenParams(max_tokens=8, top_logprobs=3))
    assert (scored, other_scored) == (plain, other) and plain.top_logprobs == ()  # asking changes no text
    for sample in (scored, other_scored):
        assert 0 < len(sample.top_logprobs) <= 8 and all(len(step) == 3 for step in sample.top_logprobs)
        for step in sample.top_logprobs:
            assert all(lp <= 0 for lp in step.values()) and sum(math.exp(lp) for lp in step.values()) <= 1 + 1e-4
        first = max(sample.top_logprobs[0], key=sample.top_logprobs[0].get)
        assert sample.startswith(first.strip())  # greedy: the text begins with the most likely first token


def test_openai_backend_gets_no_log_probabilities_from_transformers_serve(served_model):
    base_url, model, _ = served_model  # transformers serve ignores logprobs (it logs "unsupported fields")
    backend = OpenAIBackend(OpenAIConfig(base_url=base_url, model=model))
    ((sample,),) = backend.generate([QUESTION], GenParams(max_tokens=8, top_logprobs=3, deadline=Deadline(120)))
    assert sample and sample.top_logprobs == () and not backend.logprobs_refused


def test_hf_cache_is_a_plain_folder(hf_llm):
    assert (hf_llm.folder / "model.safetensors").is_file() and (hf_llm.folder / "config.json").is_file()
    assert "quantization_config" not in (hf_llm.folder / "config.json").read_text()


def test_openai_backend_talks_to_transformers_serve(served_model):
    base_url, model, log = served_model
    backend = OpenAIBackend(OpenAIConfig(base_url=base_url, model=model, concurrency=2))
    out = backend.generate([QUESTION, OTHER], GenParams(max_tokens=16, stop=["."], deadline=Deadline(120)))
    assert all(len(samples) == 1 and samples[0] and "." not in samples[0] for samples in out)
    assert "paris" in out[0][0].lower()
    assert log.read_text().count("POST /v1/chat/completions") >= 2
    ((cut,),) = backend.generate([OTHER], GenParams(max_tokens=1, deadline=Deadline(120)))
    assert cut_short(cut) == LENGTH  # the server's finish_reason "length"


def test_hf_does_not_encode_prompts_the_deadline_cannot_read(hf_llm, monkeypatch):
    """Templating and tokenising long prompts takes time too (eight 3,000-token prompts: 0.08 s, which made a
    batch overrun a 1.5 s deadline): a micro-batch that cannot read MIN_PROMPT_TOKENS each is given up first."""
    long = [{"role": "user", "content": "The harbour reported record traffic this season. " * 250 + "Sum 2 and 2."}]
    encoded = []
    monkeypatch.setattr(hf_llm, "_encode", lambda *args, **kwargs: encoded.append(args))
    assert hf_llm.generate([long] * 4, GenParams(max_tokens=32, deadline=Deadline(0.01))) == [[]] * 4
    assert encoded == []
