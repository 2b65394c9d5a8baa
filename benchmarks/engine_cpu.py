"""The submission's engine on this CPU against the hf backend: prompt-reading and generation rates of the same
model (the embedded SmolLM2, the converted folder), the same prompts and the same cores, in one run.

The hf backend runs in this process (.venv); vLLM's CPU build of the pinned release runs the same measurement
through VLLMBackend in the rehearsal venv (`make vllm-venv`), as a child process, after the hf backend is done.
Each engine is warmed up, then timed on 4 prompts of about 1,500 tokens of the CRAG sample's web text (the
reasoning stage's size) with 1 new token (reading the prompts), and on 4 others with 33 (reading, then 32 steps:
the steps' time is the call's less the reading at the first call's rate), greedy; the hf backend in float32, vLLM in
float32 and in bfloat16. The tokens generated are counted, not assumed (a sample may end early). Prints
one line with both rates and the ratios; without .venv-vllm it says so and exits 0.

A second line holds the engine to the model the project wrote: the perplexity of each, on the same tokens, the first
2,048 of the 12 longest main texts (the references stage's extractor) among the real CRAG pages of
../shared/crag_sample (else of data/crag_sample.jsonl's pages, which it says); the pages are named. The hf backend's
at the folder's RoPE base and, for scale, at 10000 (what transformers 4.57 takes when config.json holds the base only
in transformers 5's rope_parameters); vLLM's in float32 and as served (bfloat16), each as a ratio to the hf one.

    python -m benchmarks.engine_cpu
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evaluation.data import read_examples
from evaluation.engine_agreement import hf_scores, perplexity, vllm_scores
from evaluation.filler import SAMPLE, conversations
from models.config import REPO_ROOT, HFConfig, VLLMConfig
from models.llm.backend import GenParams
from models.llm.profile import folder_profile, load_profile
from utils.cli import CommandParser, command
from utils.html import parse_html, remove_boilerplate
from utils.web_pages import PageSettings, main_text

REHEARSAL_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 4, 1500, 32
VLLM_DTYPES = ("float32", "bfloat16")  # float32: the hf backend's arithmetic; bfloat16: the CPU build's fast path
SHARED_SAMPLE = REPO_ROOT.parent / "shared" / "crag_sample" / "crag_public_sample_5.jsonl.bz2"
PPL_PAGES, PPL_TOKENS = 12, 2048
DAMAGED_BASE = 10000.0  # transformers 4.57's default rope_theta for Llama-family configs


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


def page_texts() -> tuple[list[tuple[str, str]], str]:
    """(page name, main text) of the PPL_PAGES longest main texts, and the data they come from."""
    source = SHARED_SAMPLE if SHARED_SAMPLE.is_file() else SAMPLE
    settings = PageSettings()  # as the references stage reads a page
    texts = []
    for example in read_examples(source):
        for page in example["search_results"]:
            tree = parse_html(page.get("page_result") or "", settings.max_page_chars)
            if tree is not None:
                remove_boilerplate(tree)
                texts.append((page.get("page_name") or "?", main_text(tree, settings.extractor)[0]))
    return sorted(texts, key=lambda item: -len(item[1]))[:PPL_PAGES], source.name


def sequences(tokenizer, texts: list[tuple[str, str]]) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False)["input_ids"][:PPL_TOKENS] for _, text in texts]


def scored_perplexity(score, token_lists: list[list[int]]) -> float:
    """Every token after the first of each list, scored given those before it."""
    return perplexity(score(token_lists, [1] * len(token_lists), 1))


def measure_vllm(folder: str, dtype: str, token_lists: list[list[int]]) -> dict[str, float]:
    from models.llm.vllm import VLLMBackend

    llm = VLLMBackend(VLLMConfig(dtype=dtype), folder_profile(folder, max_model_len=4096))
    try:
        ppl = scored_perplexity(lambda *args: vllm_scores(llm.engine, *args), token_lists)
        return {**measure(llm, llm.engine.get_tokenizer()), "perplexity": ppl}
    finally:
        llm.close()


def measure_hf(token_lists_of) -> tuple[dict[str, float], str, list[list[int]]]:
    """The hf backend's rates, its folder, the tokens the perplexities are taken on, and its perplexity at the
    folder's RoPE base and at DAMAGED_BASE."""
    from models.llm.hf import HFBackend

    llm = HFBackend(HFConfig())
    token_lists = token_lists_of(llm.tokenizer)
    found = {**measure(llm, llm.tokenizer),
             "perplexity": scored_perplexity(lambda *args: hf_scores(llm.model, *args), token_lists)}
    with tempfile.TemporaryDirectory() as damaged:
        for file in llm.folder.iterdir():  # the weights linked, config.json with the base transformers 4 takes
            if file.name != "config.json":
                (Path(damaged) / file.name).symlink_to(file)
        config = json.loads((llm.folder / "config.json").read_text())
        config["rope_theta"] = config["rope_parameters"]["rope_theta"] = DAMAGED_BASE
        (Path(damaged) / "config.json").write_text(json.dumps(config))
        other = HFBackend(HFConfig(), folder_profile(damaged))
        found["perplexity_damaged"] = scored_perplexity(lambda *args: hf_scores(other.model, *args), token_lists)
    return found, str(llm.folder), token_lists


@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-folder", default=None, help=argparse.SUPPRESS)  # the child's side
    parser.add_argument("--vllm-dtype", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--vllm-tokens", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.vllm_folder:
        token_lists = json.loads(args.vllm_tokens.read_text())
        print(json.dumps(measure_vllm(args.vllm_folder, args.vllm_dtype, token_lists)))
        return 0
    if not REHEARSAL_PYTHON.is_file():
        print(f"engine_cpu: skipped: no {REHEARSAL_PYTHON.relative_to(REPO_ROOT)} (make vllm-venv)")
        return 0
    pages, source = page_texts()
    hf, folder, token_lists = measure_hf(lambda tokenizer: sequences(tokenizer, pages))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "PYTHONPATH": str(REPO_ROOT)}
    rates, perplexities = [], []
    children = []
    with tempfile.TemporaryDirectory() as scratch:  # the child scores the very tokens the hf backend scored
        tokens = Path(scratch) / "tokens.json"
        tokens.write_text(json.dumps(token_lists))
        for dtype in VLLM_DTYPES:
            children.append(subprocess.run(
                [str(REHEARSAL_PYTHON), "-m", "benchmarks.engine_cpu", "--vllm-folder", folder, "--vllm-dtype", dtype,
                 "--vllm-tokens", str(tokens)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800))
    for dtype, done in zip(VLLM_DTYPES, children):
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            print(f"engine_cpu: error: the vLLM child ({dtype}) exited with {done.returncode}: "
                  f"{done.stderr.strip()[-400:]}", file=sys.stderr)
            return 1
        vllm = json.loads(lines[-1])
        served = " (served)" if dtype == load_profile().dtype else ""
        perplexities.append(f"vllm {dtype}{served} {vllm['perplexity']:.2f} "
                            f"({vllm['perplexity'] / hf['perplexity']:.3f}x)")
        rates.append(f"vllm {dtype} {vllm['prefill_tps']:.0f} / {vllm['decode_tps']:.1f} "
                     f"({vllm['prefill_tps'] / hf['prefill_tps']:.2f}x / {vllm['decode_tps'] / hf['decode_tps']:.2f}x)")
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"engine_cpu: {PROMPTS} prompts of {hf['prompt_tokens'] // PROMPTS} tokens, {NEW_TOKENS} new, "
          f"{os.cpu_count()} cores, OMP_NUM_THREADS {threads}; prompt tokens/s / generated tokens/s: hf float32 "
          f"{hf['prefill_tps']:.0f} / {hf['decode_tps']:.1f}; " + "; ".join(rates))
    names = ", ".join(name for name, _ in pages)
    print(f"engine_cpu: perplexity on the first {PPL_TOKENS} tokens of the {len(pages)} longest page texts of "
          f"{source} ({sum(map(len, token_lists))} tokens: {names}): hf float32 {hf['perplexity']:.2f} "
          f"(at RoPE base {DAMAGED_BASE:.0f}: {hf['perplexity_damaged']:.2f}); " + "; ".join(perplexities))
    return 0


if __name__ == "__main__":
    sys.exit(main())
