"""The submission's engine on this CPU against the hf backend: prompt-reading and generation rates of the same
model (the embedded SmolLM2, the converted folder), the same prompts and the same cores, in one run.

The hf backend runs in this process (.venv); vLLM's CPU build of the pinned release runs the same measurement
through VLLMBackend in the rehearsal venv (`make vllm-venv`), as a child process, after the hf backend is done.
Each engine is warmed up, then timed on 4 prompts of about 1,500 tokens of the CRAG sample's web text (the
reasoning stage's size) with 1 new token (reading the prompts), and on 4 others with 33 (reading, then 32 steps:
the steps' time is the call's less the reading at the first call's rate), greedy; the hf backend in float32, vLLM in
float32 and in bfloat16. The tokens generated are counted, not assumed (a sample may end early). Prints
one line with both rates and the ratios; without .venv-vllm it says so and exits 0.

    python -m benchmarks.engine_cpu
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from evaluation.filler import conversations
from models.config import REPO_ROOT, HFConfig, VLLMConfig
from models.llm.backend import GenParams
from utils.cli import CommandParser, command

REHEARSAL_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 4, 1500, 32
VLLM_DTYPES = ("float32", "bfloat16")  # float32: the hf backend's arithmetic; bfloat16: the CPU build's fast path


def timed(llm, prompts: list, max_tokens: int) -> tuple[float, int]:
    """Seconds for one call, and the tokens it generated (counted by the samples' log-probabilities)."""
    started = time.perf_counter()
    samples = llm.generate(prompts, GenParams(max_tokens=max_tokens, logprobs=True))
    return time.perf_counter() - started, sum(len(s.token_logprobs) for [s] in samples)


def measure(llm, tokenizer) -> dict[str, float]:
    """Prompt tokens read per second, and tokens generated per second after the prompts are read. Each timed call
    gets prompts of its own: vLLM would read a prompt it has seen from its prefix cache."""
    warm, first, second = (conversations(tokenizer, 2 * PROMPTS + 1, PROMPT_TOKENS)[i:i + PROMPTS]
                           for i in (0, 1, 1 + PROMPTS))
    def length(prompts: list) -> int:
        return sum(len(tokenizer.encode(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False),
                                        add_special_tokens=False)) for p in prompts)

    timed(llm, warm[:1], 2)  # warm-up: first-call costs (kernels, caches) are not the rate
    prefill_s, _ = timed(llm, first, 1)
    total_s, generated = timed(llm, second, NEW_TOKENS + 1)
    prefill_tps = length(first) / prefill_s
    decode_s = total_s - length(second) / prefill_tps
    return {"prompt_tokens": length(first), "prefill_tps": prefill_tps,
            "decode_tps": (generated - PROMPTS) / max(decode_s, 1e-9), "generated": generated}


def measure_vllm(folder: str, dtype: str) -> dict[str, float]:
    from models.llm.vllm import VLLMBackend

    llm = VLLMBackend(VLLMConfig(model=folder, dtype=dtype, max_model_len=4096))
    try:
        return measure(llm, llm.engine.get_tokenizer())
    finally:
        llm.close()


def measure_hf() -> tuple[dict[str, float], str]:
    from models.llm.hf import HFBackend

    llm = HFBackend(HFConfig())
    return measure(llm, llm.tokenizer), str(llm.folder)


@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-folder", default=None, help=argparse.SUPPRESS)  # the child's side
    parser.add_argument("--vllm-dtype", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.vllm_folder:
        print(json.dumps(measure_vllm(args.vllm_folder, args.vllm_dtype)))
        return 0
    if not REHEARSAL_PYTHON.is_file():
        print(f"engine_cpu: skipped: no {REHEARSAL_PYTHON.relative_to(REPO_ROOT)} (make vllm-venv)")
        return 0
    hf, folder = measure_hf()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "PYTHONPATH": str(REPO_ROOT)}
    rates = []
    for dtype in VLLM_DTYPES:
        done = subprocess.run([str(REHEARSAL_PYTHON), "-m", "benchmarks.engine_cpu", "--vllm-folder", folder,
                               "--vllm-dtype", dtype], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=1800)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            print(f"engine_cpu: error: the vLLM child ({dtype}) exited with {done.returncode}: "
                  f"{done.stderr.strip()[-400:]}", file=sys.stderr)
            return 1
        vllm = json.loads(lines[-1])
        rates.append(f"vllm {dtype} {vllm['prefill_tps']:.0f} / {vllm['decode_tps']:.1f} "
                     f"({vllm['prefill_tps'] / hf['prefill_tps']:.2f}x / {vllm['decode_tps'] / hf['decode_tps']:.2f}x)")
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"engine_cpu: {PROMPTS} prompts of {hf['prompt_tokens'] // PROMPTS} tokens, {NEW_TOKENS} new, "
          f"{os.cpu_count()} cores, OMP_NUM_THREADS {threads}; prompt tokens/s / generated tokens/s: hf float32 "
          f"{hf['prefill_tps']:.0f} / {hf['decode_tps']:.1f}; " + "; ".join(rates))
    return 0


if __name__ == "__main__":
    sys.exit(main())
