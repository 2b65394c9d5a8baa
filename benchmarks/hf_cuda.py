"""The hf backend on a CUDA GPU: does its deadline clock hold with a model of a real size?

Builds a Llama-3-8B-shaped model (32 layers, hidden 4096, 32 heads and 8 KV heads, MLP 14336) with random weights
in float16 on the GPU, with the embedded SmolLM2's tokenizer and vocabulary (so 7.4 B parameters rather than 8.0 B),
saves it, and loads it through HFBackend as a config naming that folder would. Random weights never emit an end
token: every generation runs to max_tokens or to the deadline, so this measures time, not answers. It prints:

- the prompt-reading rate HFBackend measured at load, against the same forward pass timed from its launch alone
  (what a host clock reads without waiting for the GPU) and timed with the device synchronised;
- per case, a batch of conversations built from the CRAG sample's pages, its seconds against its deadline, and how
  many conversations got a sample: the contract is seconds <= deadline (plus the return of the last step);
- R2AG's prompt mode (generate_with_embeddings, random retrieval rows) under a deadline.

    python -m benchmarks.hf_cuda --tokenizer FOLDER   # needs a CUDA GPU and ~30 GB of disk for the random model

Run on an H100 for docs/how-to/gpu-submission.md. Without CUDA it says so in one line and exits 0 (make bench runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from evaluation.filler import conversations
from utils.cli import command

EIGHT_B = dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, max_position_embeddings=8192)
SMOKE = dict(num_hidden_layers=2, hidden_size=256, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=8192)  # --smoke: the script's own check, on a CPU


def build_model(tokenizer_folder: Path, folder: Path, shape: dict[str, int], device: str, dtype: torch.dtype) -> int:
    """Save a random-weight Llama of `shape` with `tokenizer_folder`'s tokenizer into `folder`; its parameter count."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False, **shape)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype: 7 B parameters in float32 would take 28 GB first
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    for parameter in model.parameters():  # small random matrices, unit norms: float16 activations stay finite
        if parameter.dim() > 1:
            parameter.data.normal_(0.0, 0.02)
    count = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return count


@torch.inference_mode()
def prefill_rates(backend, tokens: int = 4096) -> dict[str, float]:
    """One forward pass over `tokens` tokens timed three ways: from the launch alone (a host clock read without
    waiting for the GPU), with the device synchronised (device_clock), and HFBackend's own measurement at load."""
    from models.llm.hf import device_clock

    synchronised = device_clock(backend.config.device)
    ids = torch.full((1, tokens), backend.tokenizer.eos_token_id or 0, device=backend.config.device)
    backend.model(input_ids=ids[:, :16])
    started = synchronised()
    backend.model(input_ids=ids)
    launched = time.perf_counter() - started
    ran = synchronised() - started
    return {"launch_timed_tps": tokens / launched, "synchronised_tps": tokens / ran,
            "backend_measured_tps": backend._prefill_tps}


STEPS: list[float] = []  # every decoding step the deadline clock timed, in order (cleared per case)


def record_steps() -> None:
    """Keep the step times HFBackend's deadline clock measures, to show their spread."""
    from models.llm import hf

    class Recording(hf._DeadlineClock):
        def __call__(self, input_ids, scores, **kwargs):
            before = len(self.steps)
            out = super().__call__(input_ids, scores, **kwargs)
            STEPS.extend(self.steps[before:])
            return out
    hf._DeadlineClock = Recording


@torch.inference_mode()
def plain_generate(backend, convs, max_tokens: int) -> dict[str, object]:
    """The same prompts through transformers' generate alone (no deadline clock, no chunks, no hook): the baseline
    for what HFBackend adds."""
    from models.llm.hf import device_clock

    inputs = backend._encode(convs, None)
    now = device_clock(backend.config.device)
    started = now()
    out = backend.model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False, top_p=None, top_k=None,
                                 temperature=None, pad_token_id=backend.tokenizer.pad_token_id)
    seconds = now() - started
    width, new = inputs["input_ids"].shape[1], out.shape[1] - inputs["input_ids"].shape[1]
    print(f"hf_cuda: plain generate, {len(convs)} x {width} tokens, {new} new: {seconds:.2f} s", flush=True)
    return {"case": "plain generate", "seconds": round(seconds, 3), "new_tokens": int(new)}


def run_case(backend, name: str, convs, deadline_s: float | None, max_tokens: int,
             embeddings: list[np.ndarray] | None = None) -> dict[str, object]:
    from models.llm.backend import GenParams
    from models.llm.hf import device_clock
    from utils.time_budget import Deadline

    params = GenParams(max_tokens=max_tokens, deadline=None if deadline_s is None else Deadline(deadline_s))
    STEPS.clear()
    now = device_clock(backend.config.device)
    started = now()
    if embeddings is None:
        out = backend.generate(convs, params)
    else:
        out = backend.generate_with_embeddings(convs, embeddings, params)
    seconds = now() - started
    answered = sum(1 for samples in out if samples)
    lengths = [len(backend.tokenizer(s[0], add_special_tokens=False)["input_ids"]) for s in out if s]
    reasons = sorted({getattr(s[0], "finish_reason", "") for s in out if s})
    limit = deadline_s or float("inf")
    steps = np.array(STEPS) if STEPS else np.zeros(1)
    slow = np.flatnonzero(steps > 3 * np.median(steps))
    row = {"case": name, "finish": reasons, "conversations": len(convs), "deadline_s": deadline_s,
           "seconds": round(seconds, 3), "ratio": round(seconds / limit, 3), "answered": answered,
           "mean_new_tokens": round(float(np.mean(lengths)), 1) if lengths else 0.0,
           "prefill_tps_after": round(backend._prefill_tps), "step_s_after": round(backend._step_s, 4),
           "step_s": {"p50": round(float(np.median(steps)), 4), "p90": round(float(np.percentile(steps, 90)), 4),
                      "max": round(float(steps.max()), 4), "slow_at": [int(i) for i in slow],
                      "slow_s": [round(float(steps[i]), 3) for i in slow]}}
    against = "no deadline" if deadline_s is None else f"of {limit:.1f} (ratio {seconds / limit:.3f})"
    print(f"hf_cuda: {name}: {seconds:.2f} s {against}, {answered}/{len(convs)} "
          f"answered, {row['mean_new_tokens']} new tokens each, ended by {'/'.join(reasons) or '-'}; decoding steps "
          f"p50 {row['step_s']['p50']:.3f} s, max {row['step_s']['max']:.3f} s ({len(slow)} over 3x the median)",
          flush=True)
    return row


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="a folder with the SmolLM2 tokenizer (default: the embedded model's converted folder)")
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model on the CPU: checks this script only")
    parser.add_argument("--work", type=Path, default=None, help="where the random model is saved (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    device, shape = ("cpu", SMOKE) if args.smoke else ("cuda", EIGHT_B)
    if not args.smoke and not torch.cuda.is_available():
        print("hf_cuda: skipped (no CUDA device; run it on a GPU machine, see docs/how-to/gpu-submission.md)")
        return 0
    from models.config import HFConfig
    from models.llm.hf import HFBackend, resolve_model_folder
    from models.llm.profile import folder_profile

    tokenizer_folder = args.tokenizer or resolve_model_folder()
    work = args.work or Path(tempfile.mkdtemp(prefix="hf-cuda-"))
    started = time.perf_counter()
    dtype = "float32" if args.smoke else "float16"  # float16 matrix products are slow on some CPUs
    parameters = build_model(tokenizer_folder, work / "model", shape, device, getattr(torch, dtype))
    built_s = time.perf_counter() - started
    started = time.perf_counter()
    backend = HFBackend(HFConfig(device=device, dtype=dtype, micro_batch_size=8),
                        folder_profile(work / "model", prompt_tokens=8192, max_model_len=16384))
    loaded_s = time.perf_counter() - started
    gpu = "cpu (smoke)" if args.smoke else torch.cuda.get_device_name()
    print(f"hf_cuda: {gpu}, torch {torch.__version__}, {parameters / 1e9:.2f} B parameters (random, {dtype}); "
          f"built and saved in {built_s:.1f} s, HFBackend loaded it in {loaded_s:.1f} s", flush=True)
    rates = prefill_rates(backend)
    print("hf_cuda: prefill tokens/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in rates.items()), flush=True)

    medium = conversations(backend.tokenizer, 8, 1500)
    long = conversations(backend.tokenizer, 16, 3000)
    record_steps()
    rows = [run_case(backend, "8 x 1,500 tokens, 128 new, no deadline", medium, None, 128),
            plain_generate(backend, medium, 128),  # after a first generation, which pays one-time set-up costs
            run_case(backend, "8 x 1,500 tokens, 128 new, 60 s", medium, 60.0, 128),
            run_case(backend, "8 x 1,500 tokens, 1,024 new, 5 s", medium, 5.0, 1024),
            run_case(backend, "8 x 1,500 tokens, 1,024 new, 2 s", medium, 2.0, 1024),
            run_case(backend, "16 x 3,000 tokens, 256 new, 1.5 s", long, 1.5, 256),
            run_case(backend, "16 x 3,000 tokens, 256 new, 0.3 s", long, 0.3, 256)]
    placeholder = backend.retrieval_placeholder()
    rng = np.random.default_rng(0)
    r2ag = [[c[0], {**c[1], "content": c[1]["content"] + f"\nRetrieval: {placeholder} {placeholder}"}]
            for c in medium]
    rows.append(run_case(backend, "R2AG prompt mode, 8 x 1,500 tokens, 1,024 new, 3 s", r2ag, 3.0, 1024,
                         [rng.normal(0, 0.02, (2, backend.hidden_size)).astype(np.float32) for _ in r2ag]))
    worst = max(row["ratio"] for row in rows if row.get("deadline_s"))
    print(f"hf_cuda: worst ratio {worst:.3f} over the {sum(1 for r in rows if r.get('deadline_s'))} cases with a "
          f"deadline ({gpu})", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "parameters": parameters,
                                        "rates": rates, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
