"""evaluation/engine_agreement.py: vLLM's rule for holding an engine to a reference (tests/models/utils.py
check_logprobs_close), with a per-token tolerance since both sides score the same tokens."""

import math

import pytest

from evaluation.engine_agreement import largest_gap, logprob_mismatches, perplexity


def position(token, logprob, *top):
    return {"token": token, "logprob": logprob, "top": [list(pair) for pair in top]}


REFERENCE = [[position(7, -0.1, (7, -0.1), (3, -2.5)), position(4, -0.7, (4, -0.7), (9, -0.9))]]


def test_the_same_scores_within_the_tolerance_agree():
    test = [[position(7, -0.1004, (7, -0.1004), (3, -2.5)), position(4, -0.7, (4, -0.7), (9, -0.9))]]
    assert logprob_mismatches(REFERENCE, test, 1e-3) == []
    assert largest_gap(REFERENCE, test) == pytest.approx(4e-4)


def test_a_gap_over_the_tolerance_is_named():
    test = [[position(7, -0.1, (7, -0.1), (3, -2.5)), position(4, -0.95, (9, -0.6), (4, -0.95))]]
    assert logprob_mismatches(REFERENCE, test, 1e-3) == [
        "sequence 0, position 1, token 4: log-probability -0.7000 against -0.9500"]
    # a near tie that swapped the most likely token is vLLM's allowed divergence: each is in the other's top k
    assert logprob_mismatches(REFERENCE, test, 0.5) == []


def test_a_most_likely_token_outside_the_other_s_top_k_is_a_mismatch():
    test = [[position(7, -0.1, (5, -0.05), (7, -0.1)), position(4, -0.7, (4, -0.7), (9, -0.9))]]
    assert logprob_mismatches(REFERENCE, test, 1.0) == [
        "sequence 0, position 0: most likely 7 against 5, one not in the other's top k"]


def test_different_tokens_or_lengths_are_refused():
    with pytest.raises(ValueError, match="different tokens"):
        logprob_mismatches(REFERENCE, [[position(8, -0.1, (8, -0.1)), REFERENCE[0][1]]], 1.0)
    with pytest.raises(ValueError):
        logprob_mismatches(REFERENCE, [REFERENCE[0][:1]], 1.0)


def test_perplexity_is_exp_of_the_mean_negative_log_probability():
    assert perplexity(REFERENCE) == pytest.approx(math.exp(0.4))
