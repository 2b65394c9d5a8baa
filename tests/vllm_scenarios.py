"""Scenarios that VLLMBackend runs on the real engine (tests/vllm, vLLM's CPU build) and on the fake
(tests/vllm_fake.py); each returns a summary of what the engine's behaviour decides, not of what a model says, so
the differential test (tests/vllm/test_engine.py) compares the two engines' summaries for equality.

Each scenario takes the backend and a `StepClock` that counts the engine's steps (a deadline is reached after a
counted number of steps, not by wall time). The fake stands for a talkative model (`FakeLLMEngine(words=...)` per
scenario, WORDS below): a scenario that must end by length asks for fewer tokens than either model says.
"""

from __future__ import annotations

from collections.abc import Callable

from models.llm.backend import DEADLINE, LENGTH, STOP, GenParams
from utils.time_budget import Deadline

STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
POEM = [{"role": "user", "content": "Write a long poem about the sea, the wind and the ships."}]
SHORT = [{"role": "user", "content": "What is the capital of France? Answer with one word."}]
WORDS = {"samples": 50, "stop_by_itself": 3, "stop_string": 50, "deadline": 50, "over_long": 50, "refused": 50,
         "seed": 50}


class StepClock:
    """A clock that reads the number of engine steps taken: wraps `engine.step` (the real LLMEngine's or the
    fake's) so every call advances it by one."""

    def __init__(self, engine) -> None:
        self.steps = 0
        step = engine.step

        def counted():
            self.steps += 1
            return step()

        engine.step = counted

    def __call__(self) -> float:
        return float(self.steps)


def samples(llm, clock: StepClock) -> list:
    """n = 1, 3, 5: n samples per conversation, each with its own finish reason and one log-probability per
    token; max_tokens under what the model says: LENGTH."""
    out = []
    for n in (1, 3, 5):
        result = llm.generate([STORY, POEM], GenParams(n=n, temperature=0.8, seed=3, max_tokens=4, logprobs=True))
        out.append([[(s.finish_reason, len(s.token_logprobs), len(s.tokens), bool(s.text.strip()))
                     for s in conversation] for conversation in result])
    return out


def stop_by_itself(llm, clock: StepClock) -> list:
    """A short answer ends by the model's own end of turn, before max_tokens: STOP."""
    result = llm.generate([SHORT], GenParams(max_tokens=48))
    return [[s.finish_reason for s in conversation] for conversation in result]


def stop_string(llm, clock: StepClock) -> list:
    """A stop string ends the sample (STOP) and is cut off with what follows: the text is the unconstrained
    greedy text up to the stop string's first occurrence. The stop string is the third word of that text."""
    free = llm.generate([STORY], GenParams(max_tokens=16))[0][0]
    word = free.text.split()[2]
    cut = llm.generate([STORY], GenParams(max_tokens=16, stop=[word]))[0][0]
    return [free.finish_reason, cut.finish_reason, cut.text == free.text[:free.text.find(word)].strip()]


def deadline(llm, clock: StepClock) -> list:
    """A deadline reached after 4 engine steps aborts every request; each sample keeps its partial text."""
    clock.steps = 0
    params = GenParams(n=2, temperature=0.8, seed=1, max_tokens=64, logprobs=True, deadline=Deadline(3.5, clock))
    result = llm.generate([STORY, POEM], params)
    return [[(s.finish_reason, bool(s.text.strip()), len(s.token_logprobs) > 0) for s in conversation]
            for conversation in result]


def over_long(llm, clock: StepClock, too_long: int) -> list:
    """A token prompt of `too_long` words, over max_model_len, between two short ones: the backend cuts it to the
    profile's prompt_tokens, so the engine answers all three."""
    long = [{"role": "user", "content": "word " * too_long}]
    result = llm.generate([SHORT, long, POEM], GenParams(max_tokens=3))
    return [[(s.finish_reason, bool(s.text.strip())) for s in conversation] for conversation in result]


def seed(llm, clock: StepClock) -> list:
    """A fixed seed gives the same samples twice; another seed gives other samples (on a real model)."""
    params = GenParams(n=3, temperature=1.0, seed=7, max_tokens=8)
    first, second = (llm.generate([STORY], params)[0] for _ in range(2))
    return [len(first), [s.text for s in first] == [s.text for s in second]]


SCENARIOS: dict[str, Callable] = {"samples": samples, "stop_by_itself": stop_by_itself, "stop_string": stop_string,
                                  "deadline": deadline, "over_long": over_long, "seed": seed}
EXPECTED = {  # what both engines must give (the differential test compares them; this pins the pair)
    "samples": [[[(LENGTH, 4, 4, True)] * n] * 2 for n in (1, 3, 5)],
    "stop_by_itself": [[STOP]],
    "stop_string": [LENGTH, STOP, True],
    "deadline": [[(DEADLINE, True, True)] * 2] * 2,
    "refused": [[(LENGTH, True)], [], [(LENGTH, True)]],  # input embeddings over max_model_len (test_engine.py)
    "seed": [3, True],
}
