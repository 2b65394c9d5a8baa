"""benchmarks/pages.py's encoders (each backend and precision the device runs) and the agreement of two embeddings'
rankings: the top-k overlap it prints for each encoder."""

from __future__ import annotations

import numpy as np

from benchmarks.pages import top_overlap


def test_the_top_k_overlap_counts_shared_candidates_per_question_and_averages_over_questions():
    query = np.array([[1.0, 0.0]])
    ranked = [np.array([[1.0, 0.0], [0.9, 0.1], [0.5, 0.5], [0.1, 0.9]])]  # candidates 0, 1, 2, 3 in this order
    same = (query, ranked)
    assert top_overlap(same, same, k=2) == 1.0
    # another embedding that puts candidate 3 second: one of the top two shared
    moved = (query, [np.array([[1.0, 0.0], [0.1, 0.9], [0.5, 0.5], [0.95, 0.05]])])
    assert top_overlap(same, moved, k=2) == 0.5
    # order inside the top k does not count; k shrinks to a question's candidates; questions weigh the same
    swapped = (query, [np.array([[0.9, 0.1], [1.0, 0.0], [0.5, 0.5], [0.1, 0.9]])])
    assert top_overlap(same, swapped, k=2) == 1.0
    two = (np.vstack([query, query]), [ranked[0], ranked[0][:1]])
    two_moved = (np.vstack([query, query]), [moved[1][0], ranked[0][:1]])
    assert top_overlap(two, two_moved, k=2) == 0.75
    assert top_overlap((query, [np.zeros((0, 2))]), (query, [np.zeros((0, 2))])) == 1.0


def test_the_bench_runs_each_encoder_the_device_has_with_torch_float32_first(monkeypatch):
    from dataclasses import replace

    import benchmarks.pages as pages
    from models.config import REPO_ROOT
    from models.loading import load_config

    config = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    monkeypatch.setattr(pages, "bf16_supported", lambda device: True)
    assert list(pages.encoder_settings(config)) == [pages.BASELINE, "torch/bfloat16", "openvino/float32",
                                                   "openvino/bfloat16"]
    monkeypatch.setattr(pages, "bf16_supported", lambda device: False)
    assert list(pages.encoder_settings(config)) == [pages.BASELINE, "openvino/float32"]
    cuda = replace(config, embedder=replace(config.embedder, device="cuda", backend="torch"))
    assert list(pages.encoder_settings(cuda)) == [pages.BASELINE]
