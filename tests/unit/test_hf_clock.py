"""The hf backend's deadline clock: reading the prompts is given up before a chunk the deadline cannot afford,
and decoding stops before a step that would end past the deadline."""

import pytest
import torch

from models.llm.hf import STEP_WINDOW, OutOfTime, _DeadlineClock
from utils.time_budget import Deadline


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def steps_until_stopped(clock: Clock, deadline: Deadline | None, first_token_s: float, step_times: list[float],
                        previous_step_s: float = 0.0) -> tuple[_DeadlineClock, int]:
    """Drive the criterion as generate does (one call per token, the first after the prompts are read); the
    number of tokens generated when it said stop (or all of them)."""
    criterion = _DeadlineClock(deadline, previous_step_s, 1000.0, clock)
    ids = torch.zeros((2, 5), dtype=torch.long)
    clock.now += first_token_s
    for token, step in enumerate([0.0, *step_times], start=1):
        clock.now += step
        stop = criterion(ids, torch.zeros(2, 10))
        assert stop.shape == (2,) and bool(stop.all()) == bool(stop.any())  # the batch stops as one
        if bool(stop[0]):
            return criterion, token
    return criterion, len(step_times) + 1


def test_decoding_stops_before_a_step_that_would_end_past_the_deadline():
    clock = Clock()
    deadline = Deadline(10.0, clock)
    criterion, tokens = steps_until_stopped(clock, deadline, 2.0, [1.0] * 20)
    # tokens at 2, 3, ..., 9 s: at 9 s one more 1 s step would end at 10 s (allowed); at 10 s none is left
    assert tokens == 9 and clock.now <= 10.0
    assert criterion.first_token_s == 2.0 and criterion.step_s == 1.0


def test_the_expected_step_is_the_slowest_recent_one():
    """transformers' max_time stops only once the time is up; a slow step then ends past it. Here the steps slow
    down from 0.1 s to 1.5 s (a machine getting busy): the clock stops while a whole slow step is still left."""
    clock = Clock()
    deadline = Deadline(10.0, clock)
    _, tokens = steps_until_stopped(clock, deadline, 1.0, [0.1] * 5 + [1.5] * 20)
    # tokens at 1.0, 1.1, ..., 1.5, then 3.0, 4.5, 6.0, 7.5, 9.0: at 9.0 the next step would end at 10.5
    assert tokens == 11 and abs(clock.now - 9.0) < 1e-9
    # a single slow step among fast ones is remembered for STEP_WINDOW steps
    clock = Clock()
    criterion, _ = steps_until_stopped(clock, None, 0.5, [0.1, 2.0] + [0.1] * (STEP_WINDOW - 1))
    assert criterion.step_s == 2.0
    clock = Clock()
    criterion, _ = steps_until_stopped(clock, None, 0.5, [0.1, 2.0] + [0.1] * STEP_WINDOW)
    assert abs(criterion.step_s - 0.1) < 1e-9


def test_the_first_check_uses_the_previous_generations_step():
    """After the prompts are read no step of this generation has been timed yet: the previous one's is used, so
    a deadline that leaves less than one step stops at the first token."""
    clock = Clock()
    deadline = Deadline(3.0, clock)
    _, tokens = steps_until_stopped(clock, deadline, 2.5, [0.8] * 5, previous_step_s=0.8)
    assert tokens == 1 and clock.now == 2.5
    clock = Clock()
    _, tokens = steps_until_stopped(clock, None, 2.5, [0.8] * 5, previous_step_s=0.8)
    assert tokens == 6  # no deadline: never stops


def read_chunks(clock: Clock, deadline: Deadline, chunks: list[tuple[int, float]], rate: float) -> int:
    """Drive before_forward as the chunked prefill does: (tokens, seconds it really takes) per chunk; the number
    of chunks read before OutOfTime (all of them when none is raised)."""
    criterion = _DeadlineClock(deadline, 0.0, rate, clock)
    for read, (tokens, seconds) in enumerate(chunks):
        try:
            criterion.before_forward(tokens)
        except OutOfTime:
            assert criterion.prompt_tokens == sum(t for t, _ in chunks[:read])
            return read
        clock.now += seconds
    return len(chunks)


def test_reading_stops_before_a_chunk_the_deadline_cannot_afford():
    # planned at 100 tokens/s; the machine got three times slower: the first chunk shows it, and the third is
    # not started (2 s left, a chunk takes 3 s), where reading it all would have ended at 12 s against 8 s
    clock = Clock()
    assert read_chunks(clock, Deadline(8.0, clock), [(100, 3.0)] * 4, rate=100.0) == 2 and clock.now == 6.0
    # at the planned rate everything is read
    clock = Clock()
    assert read_chunks(clock, Deadline(8.0, clock), [(100, 1.0)] * 4, rate=100.0) == 4
    # before any chunk is timed, the backend's rate decides
    clock = Clock()
    assert read_chunks(clock, Deadline(0.5, clock), [(100, 1.0)], rate=100.0) == 0


def test_decoding_passes_are_not_checked_as_prompt_chunks():
    clock = Clock()
    deadline = Deadline(1.0, clock)
    criterion = _DeadlineClock(deadline, 0.0, 100.0, clock)
    criterion.before_forward(50)
    clock.now += 0.5
    criterion(torch.zeros((1, 3), dtype=torch.long), torch.zeros(1, 10))  # the first token: the prompts are read
    clock.now += 10.0
    criterion.before_forward(1)  # a decoding pass: the stopping criterion, not the hook, ends decoding
    with pytest.raises(OutOfTime):
        _DeadlineClock(deadline, 0.0, 100.0, clock).before_forward(1)


def test_a_chunk_is_expected_to_read_as_slowly_as_the_last_one_when_that_is_slower_than_the_average():
    # each chunk attends to the ones before it: 0.1 s, then 0.3 s per 100 tokens. With 0.25 s left, the average
    # (500 tokens/s: 0.2 s) would start the third chunk; the last one's rate (0.3 s) does not
    clock = Clock()
    assert read_chunks(clock, Deadline(0.65, clock), [(100, 0.1), (100, 0.3), (100, 0.5)], rate=1000.0) == 2
    assert clock.now == pytest.approx(0.4)


def test_reading_is_timed_from_the_first_forward_pass_not_from_generate_s_set_up():
    """generate prepares (stop strings, caches) before the first forward pass; counted as reading, a short read
    looked many times slower than it was and starved the next admissions."""
    clock = Clock()
    criterion = _DeadlineClock(Deadline(100.0, clock), 0.0, 100.0, clock)
    clock.now += 4.0  # generate's set-up
    criterion.before_forward(100)
    clock.now += 1.0
    criterion.before_forward(100)
    assert criterion.read_s == 1.0 and criterion.prompt_tokens == 200  # 100 tokens/s, not 20
    clock.now += 1.0
    criterion(torch.zeros((1, 3), dtype=torch.long), torch.zeros(1, 10))
    assert criterion.first_token_s == 2.0


def test_on_cuda_the_backend_reads_the_clock_after_the_device_has_run_its_queued_work(monkeypatch):
    # CUDA kernels run asynchronously: a host clock read right after a forward pass times its launch. On an H100
    # (benchmarks/hf_cuda.py, an 8B-shaped model) the launch-timed rate was 1.4 to 2 times the real one.
    from models.llm import hf

    synced: list[torch.device] = []
    monkeypatch.setattr(hf.torch.cuda, "synchronize", lambda device=None: synced.append(device))
    assert hf.device_clock("cpu") is hf.time.perf_counter
    now = hf.device_clock("cuda:1")
    first = now()
    assert now() >= first and synced == [torch.device("cuda:1")] * 2
