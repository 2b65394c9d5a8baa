"""R2AG benchmark: R2-Former training throughput, the r2ag stage's cost, and the cost of injecting retrieval
embeddings into generation, each against a baseline measured in the same run.

(a) training: QDM steps (forward, backward, Adam) over synthetic lists of --refs references, on the CPU (the
    baseline) and, when CUDA is present, on the GPU: lists per second and the GPU/CPU ratio.
(b) stage: retrieval features and an R2-Former forward for a batch of --batch queries, ms per query, on the CPU.
(c) injection: greedy generation of the same reasoning-style prompts from input ids (the baseline) and from
    input embeddings with the placeholders' rows overwritten (hf backend on --device); the ratio is the overhead.
    --random-weights builds the model from an HF folder's config with random weights (for a machine that has the
    config and tokenizer but not the weights); both sides then run the same random model.

The last line is: r2former: train cpu X lists/s[, cuda Y lists/s (Z.ZZx)], stage W ms/query, injection V.VVx on D
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from loguru import logger

from models.config import HFConfig
from models.llm.backend import GenParams
from models.llm.hf import HFBackend
from models.llm.profile import ModelProfile, folder_profile
from models.retrieval.r2former_head import Checkpoint, R2Former, R2FormerConfig, R2FormerHead, retrieval_features
from training.r2former_training import TrainSettings, synthetic_lists, train
from utils.cli import command


def training_rate(device: str, lists: list, batch_size: int, repeats: int) -> float:
    """Lists per second of QDM training on `device`: the best of `repeats` one-epoch runs after a warm-up epoch."""
    model = R2Former(R2FormerConfig())
    settings = TrainSettings(epochs=1, batch_size=batch_size, device=device)
    train(model, lists[:batch_size * 2], lists[:batch_size], settings)  # warm-up: kernels, allocator
    best = float("inf")
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        train(model, lists, lists[:1], settings)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return len(lists) / best


def stage_ms_per_query(refs: int, batch: int, dim: int, repeats: int) -> float:
    """Features and the R2-Former forward for a batch, as the r2ag stage runs them (CPU), per query."""
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(batch, dim)).astype(np.float32)
    documents = rng.normal(size=(batch, refs, dim)).astype(np.float32)
    head = R2FormerHead(Checkpoint(R2Former(R2FormerConfig()), "bench", False, {}))
    best = float("inf")
    for _ in range(repeats + 1):
        started = time.perf_counter()
        head.run([retrieval_features(q, d) for q, d in zip(queries, documents)])
        best = min(best, time.perf_counter() - started)
    return 1000 * best / batch


def random_weights_folder(folder: Path, dtype: str) -> Path:
    """A copy of an HF folder's config and tokenizer with freshly initialised weights (seeded)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    target = Path(tempfile.mkdtemp(prefix="r2bench-"))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=getattr(torch, dtype))
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(folder).save_pretrained(target)
    return target


def injection_overhead(config: HFConfig, profile: ModelProfile | None, refs: int, batch: int, tokens: int,
                       repeats: int) -> tuple[float, float]:
    """(seconds from ids, seconds from embeddings): best of `repeats` greedy generations of the same batch."""
    llm = HFBackend(config, profile)
    placeholder = llm.retrieval_placeholder()
    token = llm.tokenizer.convert_tokens_to_ids(placeholder)
    own = llm.model.get_input_embeddings().weight[token].detach().float().cpu().numpy()
    conversations = [[{"role": "user", "content": "\n".join(
        f"[{i}] similarity: {placeholder} Reference {i} of question {q}: a sentence of page text about the topic."
        for i in range(refs)) + f"\nQuestion {q}: what does reference 1 say?"}] for q in range(batch)]
    embeddings = [np.stack([own] * refs) for _ in conversations]  # the same model input: outputs are identical
    params = GenParams(max_tokens=tokens, temperature=0.0)
    timings = {"ids": float("inf"), "embeds": float("inf")}
    outputs = {}
    for _ in range(repeats + 1):  # the first round warms both paths up
        for name in timings:
            if config.device.startswith("cuda"):
                torch.cuda.synchronize()
            started = time.perf_counter()
            outputs[name] = (llm.generate(conversations, params) if name == "ids"
                             else llm.generate_with_embeddings(conversations, embeddings, params))
            if config.device.startswith("cuda"):
                torch.cuda.synchronize()
            timings[name] = min(timings[name], time.perf_counter() - started)
    if outputs["ids"] != outputs["embeds"]:
        raise SystemExit("error: generation from injected embeddings differs from generation from ids")
    return timings["ids"], timings["embeds"]


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lists", type=int, default=2048, help="synthetic training lists")
    parser.add_argument("--refs", type=int, default=10, help="references per list (10: Tasks 1/2; try 50: Task 3)")
    parser.add_argument("--train-batch", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="queries per pipeline batch (stage, injection)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf-model", default=None, help="HF folder for (c); default: the embedded SmolLM2")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="for (c)")
    parser.add_argument("--dtype", default=None, help="for (c); default float16 on CUDA, float32 on CPU")
    parser.add_argument("--random-weights", action="store_true", help="(c) with --hf-model's config, random weights")
    parser.add_argument("--tokens", type=int, default=32, help="generated tokens per prompt in (c)")
    args = parser.parse_args(argv)
    logger.remove()
    logger.add(sys.stderr, level="WARNING")

    lists = synthetic_lists(args.lists, seed=0, k_range=(args.refs, args.refs + 1), dim=384)
    cpu_rate = training_rate("cpu", lists, args.train_batch, args.repeats)
    print(f"(a) training, {args.lists} lists of {args.refs}, batch {args.train_batch}: cpu {cpu_rate:.0f} lists/s")
    train_part = f"train cpu {cpu_rate:.0f} lists/s"
    if torch.cuda.is_available():
        gpu_rate = training_rate("cuda", lists, args.train_batch, args.repeats)
        name = torch.cuda.get_device_name()
        print(f"    cuda ({name}) {gpu_rate:.0f} lists/s, {gpu_rate / cpu_rate:.2f}x the cpu")
        train_part += f", cuda {gpu_rate:.0f} lists/s ({gpu_rate / cpu_rate:.2f}x)"
    stage = stage_ms_per_query(args.refs, args.batch, 384, args.repeats)
    print(f"(b) r2ag stage, batch of {args.batch}, {args.refs} references: {stage:.2f} ms/query")

    dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
    folder = args.hf_model
    if args.random_weights:
        if not folder:
            raise SystemExit("error: --random-weights needs --hf-model (a folder with config.json and a tokenizer)")
        folder = str(random_weights_folder(Path(folder), dtype))
    config = HFConfig(device=args.device, dtype=dtype, micro_batch_size=args.batch)
    profile = folder_profile(folder, prompt_tokens=4096, max_model_len=8192) if folder else None
    ids_s, embeds_s = injection_overhead(config, profile, args.refs, args.batch, args.tokens, args.repeats)
    print(f"(c) greedy generation, {args.batch} prompts x {args.tokens} tokens on {args.device} ({dtype}): "
          f"from ids {ids_s:.3f} s, from injected embeddings {embeds_s:.3f} s (outputs identical)")
    print(f"r2former: {train_part}, stage {stage:.2f} ms/query, injection {embeds_s / ids_s:.2f}x on {args.device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
