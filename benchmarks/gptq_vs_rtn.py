"""Quantization benchmark: GPTQ against round-to-nearest (RTN), both W4A16 g64 (compressed-tensors pack-quantized,
what vLLM's Marlin kernels load), on the embedded SmolLM2-135M: wall time of each, and held-out perplexity and KL
divergence from the fp16 model.

Runs in the quantization venv and drives tools/quantize.py end to end, one process at a time, on one torch thread:
the runtime venv (.venv, `make setup`) de-quantises the GGUF to an fp16 folder and renders the texts (the sample
questions, and the 5 real CRAG dev questions of ../shared/crag_sample when present, in the reasoning prompt through
the chat template; --held-out of them, seeded, are kept out of calibration); .venv-quantize (`make quantize-venv`)
runs `gptq` on the rest and `rtn`, each timed as the whole command (load, quantize, save; the quantization step
alone in brackets), and scores the three folders on the held-out texts here (tools/quantize.py's eval code).

    .venv-quantize/bin/python -m benchmarks.gptq_vs_rtn                 # 5 to 8 minutes on 2 cores
    .venv-quantize/bin/python -m benchmarks.gptq_vs_rtn --held-out 3    # more calibration, noisier perplexity

The last line is: quantize: SmolLM2-135M W4A16 g64, N calibration texts (T tokens): gptq X s (Q s), rtn Y s (R s);
held-out perplexity (M texts) fp16 a, gptq b, rtn c (gptq/rtn ppl ratio r); KL to fp16 gptq k, rtn l nats/token
Target: gptq/rtn ratio below 1 (GPTQ helps). It reports and never gates (exit 0; 1 when a step fails).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from utils.cli import command  # standard library only

# .venv-quantize runs this and does not install the project: nothing from models/ (its imports need .venv).
REPO_ROOT = Path(__file__).resolve().parent.parent

TOOL = REPO_ROOT / "tools" / "quantize.py"
SAMPLE = REPO_ROOT / "data" / "crag_sample.jsonl"
SHARED_SAMPLE = REPO_ROOT.parent / "shared" / "crag_sample" / "crag_public_sample_5.jsonl.bz2"


class StepFailed(RuntimeError):
    pass


def step(python: Path | str, log: Path, *args: str | Path) -> tuple[float, str]:
    """Run `python tools/quantize.py ARGS` with its output in `log`; (wall seconds, stdout)."""
    started = time.perf_counter()
    result = subprocess.run([str(python), str(TOOL), *map(str, args)], cwd=REPO_ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    log.write_text(f"$ {python} tools/quantize.py {' '.join(map(str, args))}\n{result.stdout}\n{result.stderr}",
                   encoding="utf-8")
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise StepFailed(f"tools/quantize.py {args[0]} exited {result.returncode}: {tail} (whole output: {log})")
    return seconds, result.stdout


def quantize_seconds(stdout: str) -> float:
    """The quantization step's seconds from the command's last line (`wrote ...: gptq ... in 12.3 s on cpu`)."""
    found = re.search(r" in ([0-9.]+) s on \w+", stdout)
    return float(found.group(1)) if found else float("nan")


def held_out_scores(fp16: Path, folders: dict[str, Path], texts: Path, threads: int) -> tuple[dict, int, int, int]:
    """The scores of tools/quantize.py eval (training/quantization.py) of each folder against fp16 on the held-out
    texts, and the number of held-out texts, their tokens and the calibration texts' tokens."""
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from training import quantization as quantize

    hf_logging.disable_progress_bar()
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(fp16)
    held_out = quantize.tokenize(tokenizer, quantize.read_texts(texts, quantize.HELD_OUT), 2048)
    calibration = quantize.tokenize(tokenizer, quantize.read_texts(texts, quantize.CALIBRATION), 2048)
    models = {name: quantize.load_for_eval(folder, "cpu") for name, folder in folders.items()}
    result = quantize.score(quantize.load_for_eval(fp16, "cpu"), models, held_out, "cpu")
    return result, len(held_out), result["reference"]["tokens"], sum(map(len, calibration))


@command
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--held-out", type=int, default=6, help="questions scored, kept out of calibration")
    parser.add_argument("--group-size", type=int, default=64, help="SmolLM2-135M's widths (576) need 64 or less")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (GPTQ runs fastest on 1)")
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "runs" / "quantize" / "bench",
                        help="folder for the fp16, gptq and rtn folders, the texts and each step's log")
    parser.add_argument("--runtime-python", type=Path, default=REPO_ROOT / ".venv" / "bin" / "python",
                        help="the runtime venv's python, for the gguf and texts steps")
    args = parser.parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars, here or in the steps (read when tqdm is imported)
    if importlib.util.find_spec("llmcompressor") is None:
        print(f"quantize: needs .venv-quantize (make quantize-venv): run .venv-quantize/bin/python -m "
              f"benchmarks.gptq_vs_rtn, not {sys.executable}", file=sys.stderr)
        return 1
    if not args.runtime_python.is_file():
        print(f"quantize: no runtime venv at {args.runtime_python} (make setup), which makes the fp16 folder and "
              "the texts", file=sys.stderr)
        return 1
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    fp16, texts = work / "smollm2-fp16", work / "texts.jsonl"
    folders = {"gptq": work / f"smollm2-gptq-w4a16-g{args.group_size}",
               "rtn": work / f"smollm2-rtn-w4a16-g{args.group_size}"}
    data = [SAMPLE, *([SHARED_SAMPLE] if SHARED_SAMPLE.is_file() else [])]
    threads = ("--threads", str(args.threads), "--device", "cpu")
    try:
        step(args.runtime_python, work / "gguf.log", "gguf", "--out", fp16, "--force")
        step(args.runtime_python, work / "texts.log", "texts", "--model", fp16,
             *(item for path in data for item in ("--data", path)), "--held-out", args.held_out, "--out", texts)
        gptq_s, gptq_out = step(sys.executable, work / "gptq.log", "gptq", "--model", fp16, "--texts", texts,
                                "--group-size", args.group_size, *threads, "--out", folders["gptq"], "--force")
        rtn_s, rtn_out = step(sys.executable, work / "rtn.log", "rtn", "--model", fp16,
                              "--group-size", args.group_size, *threads, "--out", folders["rtn"], "--force")
    except StepFailed as err:
        print(f"quantize: {err}", file=sys.stderr)
        return 1
    scores, held, held_tokens, calibration_tokens = held_out_scores(fp16, folders, texts, args.threads)
    calibration = int(re.search(r"on (\d+) calibration texts", gptq_out).group(1))
    ppl = {name: scores[name]["ppl"] for name in ("reference", *folders)}
    print(f"quantize: SmolLM2-135M W4A16 g{args.group_size}, {calibration} calibration texts ({calibration_tokens} "
          f"tokens), {args.threads} thread(s): gptq {gptq_s:.1f} s ({quantize_seconds(gptq_out):.1f} s quantizing), "
          f"rtn {rtn_s:.1f} s ({quantize_seconds(rtn_out):.1f} s); held-out perplexity ({held} texts, {held_tokens} "
          f"tokens) fp16 {ppl['reference']:.3f}, gptq {ppl['gptq']:.3f}, rtn {ppl['rtn']:.3f} (gptq/rtn ppl ratio "
          f"{ppl['gptq'] / ppl['rtn']:.3f}); KL to fp16 gptq {scores['gptq']['kl']:.4f}, rtn {scores['rtn']['kl']:.4f} "
          "nats/token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
