"""Quantize a Hugging Face model to GPTQ W4A16 with llm-compressor, in the compressed-tensors "pack-quantized"
format vLLM loads (its Marlin/Machete WNA16 kernels), calibrated on CRAG questions in our reasoning prompt.

Two virtual environments, because llm-compressor pins transformers (5.15-5.17) below the runtime's (5.23):
the runtime's .venv renders the calibration texts (it runs our references stage and prompts), and
.venv-quantize (requirements-quantize.txt, `make quantize-venv`) quantizes them. This file imports only the
standard library at the top, so both can run it; each command says which venv it needs.

    # .venv: a GGUF de-quantised to a plain fp16 HF folder (default: the embedded SmolLM2-135M)
    .venv/bin/python tools/quantize.py gguf --out runs/quantize/smollm2-fp16
    # .venv: CRAG questions and their pages through --config's references stage, rendered in the reasoning
    # prompt with the gold answer block, through the model's chat template; one JSONL row per question
    .venv/bin/python tools/quantize.py texts --model runs/quantize/smollm2-fp16 --out runs/quantize/texts.jsonl
    # .venv-quantize: GPTQ W4A16 (or `rtn`: round-to-nearest, same scheme, no calibration)
    .venv-quantize/bin/python tools/quantize.py gptq --model runs/quantize/smollm2-fp16 \\
        --texts runs/quantize/texts.jsonl --group-size 64 --out runs/quantize/smollm2-w4a16-g64
    # .venv-quantize: perplexity of each folder, and its KL divergence from the reference, on held-out texts
    .venv-quantize/bin/python tools/quantize.py eval --reference runs/quantize/smollm2-fp16 \\
        --model runs/quantize/smollm2-w4a16-g64 --texts runs/quantize/texts.jsonl --split held_out

Texts rows are {"text", "split", "interaction_id"}; `texts --held-out N` marks N questions (seeded) "held_out",
the rest "calibration"; gptq uses the "calibration" rows (a row without "split" counts as one), so any JSONL of
{"text"} rows is a calibration set too. Texts are tokenized as written (the chat template already holds the
special tokens); one longer than --max-seq-length keeps its head quarter and its tail (the question and
answer), as the hf backend cuts an over-long prompt.

On a CPU the calibration forward runs in float32 (CPU float16 matmuls are far slower) and the result is saved in
the model's own dtype (--dtype to change it; T4s need float16): the packed int4 weights and their scales are the
same either way, up to the scales' rounding to the saved dtype. The output folder is written to a temporary
folder beside it and renamed into place; an existing non-empty --out needs --force.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # .venv-quantize does not install the project; the packages come from the checkout
    sys.path.insert(0, str(REPO))

from training.quantization import (  # noqa: E402 - after the sys.path line
    CALIBRATION,
    HELD_OUT,
    QuantizeError,
    load_for_eval,
    read_texts,
    score,
    tokenize,
)
from utils.cli import CommandParser, check_out_file, command, interrupted  # noqa: E402 - after the sys.path line
from utils.model_folders import portable_folder  # noqa: E402 - after the sys.path line

DEFAULT_DATA = REPO / "data" / "crag_sample.jsonl"
WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
MARLIN_GROUP_SIZES = (-1, 32, 64, 128)  # what vLLM's Marlin WNA16 kernels take
DTYPES = ("float16", "bfloat16", "float32")
THREADS_HELP = ("CPU threads for torch (default: torch's choice); GPTQ's column-by-column updates of a small model "
                "run fastest on 1, many times faster than on 2 busy cores")


# --- inputs (both venvs) --------------------------------------------------------------------------------------


def model_config(folder: Path, flag: str = "--model") -> dict[str, Any]:
    """config.json of an HF model folder; a QuantizeError for a missing folder or config."""
    if not folder.exists():
        raise QuantizeError(f"{flag} {folder}: no such folder; give a Hugging Face model folder (config.json, "
                            "safetensors, tokenizer files)")
    if not folder.is_dir():
        raise QuantizeError(f"{flag} {folder}: a file, not a folder; give a Hugging Face model folder (for a .gguf "
                            "file, `tools/quantize.py gguf --gguf FILE --out FOLDER` makes one)")
    path = folder / "config.json"
    if not path.is_file():
        raise QuantizeError(f"{flag} {folder}: no config.json, so not a Hugging Face model folder; give the folder "
                            "save_pretrained wrote (or `tools/quantize.py gguf` for a .gguf)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise QuantizeError(f"{flag} {folder}: config.json is unreadable ({err}); restore it") from err
    if not isinstance(config, dict):
        raise QuantizeError(f"{flag} {folder}: config.json is not a JSON object; restore it")
    return config


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (multimodal configs nest it under text_config)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def linear_input_sizes(config: dict[str, Any]) -> dict[str, int]:
    """The input widths of a decoder's Linear layers that a weight group runs along: hidden size (q, k, v, gate,
    up), intermediate size (down) and heads x head dim (o)."""
    config = text_config(config)
    sizes = {}
    for key in ("hidden_size", "intermediate_size", "moe_intermediate_size"):
        if isinstance(config.get(key), int):
            sizes[key] = config[key]
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if isinstance(hidden, int) and heads else None)
    if isinstance(heads, int) and isinstance(head_dim, int):
        sizes["num_attention_heads x head_dim"] = heads * head_dim
    return sizes


def check_group_size(config: dict[str, Any], group_size: int, folder: Path) -> None:
    if group_size < 1:
        raise QuantizeError(f"--group-size {group_size}: must be a positive number of weights per scale "
                            f"(vLLM's Marlin kernels take {', '.join(map(str, MARLIN_GROUP_SIZES[1:]))})")
    sizes = linear_input_sizes(config)
    if "hidden_size" not in sizes:
        raise QuantizeError(f"--model {folder}: config.json names no hidden_size; give a decoder LLM's folder")
    bad = {name: size for name, size in sizes.items() if size % group_size}
    if bad:
        name, size = next(iter(bad.items()))
        fits = [g for g in MARLIN_GROUP_SIZES[1:] if all(s % g == 0 for s in sizes.values())]
        raise QuantizeError(f"--group-size {group_size} does not divide {name} {size} of {folder}; give one that "
                            f"divides {', '.join(f'{k} {v}' for k, v in sizes.items())}"
                            + (f" (e.g. {fits[-1]})" if fits else ""))


def check_out(out: Path, force: bool) -> None:
    """A QuantizeError unless `out` can become the output folder."""
    if out.exists() and not out.is_dir():
        raise QuantizeError(f"--out {out}: a file, not a folder; give a folder path")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise QuantizeError(f"--out {out}: exists and is not empty; give a new folder, or --force to replace it")
    existing = out.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise QuantizeError(f"--out {out}: {existing} is not a writable folder; give a folder you can write to")


def staging_folder(out: Path) -> Path:
    """An empty folder beside `out` to write into (mode as a plain mkdir would make it), renamed to `out` when done."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.staging-"))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)
    return staging


def replace_folder(staging: Path, out: Path) -> None:
    """Rename the finished `staging` folder to `out`; an existing `out` (checked by check_out) is moved aside
    first and removed last, so `out` is never half-written. Its files get the mode a plain write would give them
    (safetensors writes model.safetensors 0600, which a server running as another user cannot read)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in staging.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old)


def copy_side_files(source: Path, target: Path) -> list[str]:
    """The tokenizer, chat template and other non-weight files of `source` that `target` lacks, copied as they are
    (so the quantized folder tokenizes exactly as the original); then the folder made portable, so that the
    submission's transformers 4 reads the tokenizer and the RoPE transformers 5 wrote (utils/model_folders.py)."""
    copied = []
    for path in sorted(source.iterdir()):
        if (path.is_file() and not path.name.endswith(WEIGHT_FILES) and path.name not in WEIGHT_INDEXES
                and not (target / path.name).exists()):
            shutil.copy2(path, target / path.name)
            copied.append(path.name)
    portable_folder(target)
    return copied


# --- gguf and texts (.venv) -----------------------------------------------------------------------------------


def dense_from_gguf(gguf: Path | None, out: Path, dtype: str, force: bool) -> Path:
    """A plain HF folder in `dtype` from `gguf` (default: the model profile's weights, the embedded SmolLM2),
    de-quantised by transformers."""
    import torch
    from transformers import AutoModelForCausalLM

    from models.llm.hf import converted_folder, resolve_model_folder

    if gguf is not None and not gguf.is_file():
        raise QuantizeError(f"--gguf {gguf}: no such file; give a .gguf model file (or leave --gguf out for the "
                            "embedded SmolLM2)")
    check_out(out, force)
    source = converted_folder(gguf, None) if gguf else resolve_model_folder()  # float32, cached
    model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))
    staging = staging_folder(out)
    try:
        model.save_pretrained(staging)
        copy_side_files(source, staging)
        replace_folder(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def render_texts(data: list[Path], model: Path, config_path: Path | None, held_out: int, seed: int,
                 limit: int | None) -> list[dict[str, str]]:
    """One row per CRAG question: its pages through the references stage of the config, the reasoning prompt over
    them followed by the gold answer block, through the model's chat template."""
    from transformers import AutoTokenizer

    from evaluation.data import check_data_file, read_examples
    from models.loading import load_config
    from training.examples import answer_block, reasoning_conversations

    model_config(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.chat_template is None:
        raise QuantizeError(f"--model {model}: the tokenizer has no chat template, so the reasoning prompt cannot be "
                            "rendered as served; give an instruction-tuned model's folder")
    examples: list[dict] = []
    for path in data:
        check_data_file(path, examples=True)
        examples.extend(read_examples(path, limit=limit))
    if not examples:
        raise QuantizeError(f"--data {' '.join(map(str, data))}: no CRAG examples; give CRAG-format .jsonl(.bz2)")
    if not 0 <= held_out < len(examples):
        raise QuantizeError(f"--held-out {held_out}: must leave calibration questions among the {len(examples)} "
                            f"given; give 0 to {len(examples) - 1}")
    config = load_config(config_path)
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    held = set(order[:held_out])
    rows = []
    for index, (conversation, example) in enumerate(reasoning_conversations(examples, config)):
        messages = [*conversation, {"role": "assistant", "content": answer_block(str(example["answer"]))}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        rows.append({"interaction_id": example["interaction_id"], "split": HELD_OUT if index in held else CALIBRATION,
                     "text": text})
    return rows


def write_rows(rows: list[dict[str, str]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tmp-{os.getpid()}"
    with staging.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(staging, out)


# --- gptq, rtn and eval (.venv-quantize) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Scheme:
    bits: int = 4
    group_size: int = 128

    @property
    def name(self) -> str:
        return f"W{self.bits}A16 g{self.group_size}"


def scheme_groups(scheme: Scheme) -> dict[str, Any]:
    """compressed-tensors config groups: every Linear's weights in signed symmetric int groups along the input;
    activations stay 16-bit (W4A16)."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    weights = QuantizationArgs(num_bits=scheme.bits, type="int", symmetric=True, strategy="group",
                               group_size=scheme.group_size)
    return {"group_0": QuantizationScheme(targets=["Linear"], weights=weights)}


def saved_dtype(config: dict[str, Any], requested: str | None) -> str:
    found = requested or text_config(config).get("dtype") or config.get("dtype") or config.get("torch_dtype")
    return found if found in DTYPES else "float16"


def quantize(model_dir: Path, out: Path, scheme: Scheme, method: str, texts: list[str] | None,
             max_seq_length: int, dtype: str | None, device: str, dampening: float, force: bool) -> float:
    """Quantize `model_dir` into `out` (`method` gptq: calibrated on `texts`; rtn: round-to-nearest, data-free);
    returns the seconds the quantization itself took (load and save excluded)."""
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = model_config(model_dir)
    target = saved_dtype(config, dtype)
    compute = torch.float32 if device == "cpu" else getattr(torch, target)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=compute)  # transformers types .to() for a model
    model = model.to(device).eval()
    groups = scheme_groups(scheme)
    if method == "gptq":
        ids = tokenize(tokenizer, texts or [], max_seq_length)
        dataset = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(row) for row in ids]})
        recipe = GPTQModifier(config_groups=groups, ignore=["lm_head"], dampening_frac=dampening)
        started = time.perf_counter()
        oneshot(model=model, dataset=dataset, recipe=recipe, max_seq_length=max_seq_length,
                num_calibration_samples=len(ids), shuffle_calibration_samples=False)
    else:
        recipe = QuantizationModifier(config_groups=groups, ignore=["lm_head"])
        started = time.perf_counter()
        oneshot(model=model, recipe=recipe)
    seconds = time.perf_counter() - started
    model.to(getattr(torch, target))
    staging = staging_folder(out)
    try:
        model.save_pretrained(staging, save_compressed=True)
        copy_side_files(model_dir, staging)
        check_saved(staging, scheme)
        replace_folder(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return seconds


def check_saved(folder: Path, scheme: Scheme) -> None:
    """A RuntimeError unless `folder`'s config.json declares the packed compressed-tensors scheme vLLM reads."""
    quant = model_config(folder, "output").get("quantization_config") or {}
    weights = ((quant.get("config_groups") or {}).get("group_0") or {}).get("weights") or {}
    found = (quant.get("quant_method"), quant.get("format"), weights.get("num_bits"), weights.get("group_size"))
    if found != ("compressed-tensors", "pack-quantized", scheme.bits, scheme.group_size):
        raise RuntimeError(f"{folder}: saved quantization_config is {found}, not compressed-tensors pack-quantized "
                           f"{scheme.name}")


# --- command line ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = CommandParser(
        prog="quantize.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    gguf = commands.add_parser("gguf", help="(.venv) a GGUF de-quantised to a plain HF folder")
    gguf.add_argument("--gguf", type=Path, default=None, help="a .gguf file (default: the embedded SmolLM2-135M)")
    gguf.add_argument("--dtype", choices=DTYPES, default="float16")
    gguf.add_argument("--out", type=Path, required=True)
    gguf.add_argument("--force", action="store_true", help="replace an existing non-empty --out")

    texts = commands.add_parser("texts", help="(.venv) calibration texts: CRAG questions in the reasoning prompt")
    texts.add_argument("--model", type=Path, required=True, help="the HF folder to quantize (its chat template)")
    texts.add_argument("--data", type=Path, action="append", default=None,
                       help=f"CRAG-format .jsonl(.bz2), repeatable (default: {DEFAULT_DATA.relative_to(REPO)})")
    texts.add_argument("--config", type=Path, default=None, help="system config: references stage and prompts "
                       "(default: configs/cpu.yaml; give the serving config)")
    texts.add_argument("--held-out", type=int, default=0, help="questions marked held_out (for eval), not calibration")
    texts.add_argument("--limit", type=int, default=None, help="the first N questions of each --data")
    texts.add_argument("--seed", type=int, default=0)
    texts.add_argument("--out", type=Path, required=True, help="the .jsonl to write")

    for method, what in (("gptq", "GPTQ"), ("rtn", "round-to-nearest")):
        command = commands.add_parser(method, help=f"(.venv-quantize) {what} W4A16 into a folder vLLM loads")
        command.add_argument("--model", type=Path, required=True, help="an HF model folder")
        if method == "gptq":
            command.add_argument("--texts", type=Path, required=True, help="calibration .jsonl (`texts` writes it)")
            command.add_argument("--max-seq-length", type=int, default=2048, help="tokens per calibration text")
            command.add_argument("--dampening", type=float, default=0.01, help="GPTQ Hessian dampening fraction")
        command.add_argument("--group-size", type=int, default=128, help="weights per scale; must divide the "
                             "model's layer widths (SmolLM2-135M: 64)")
        command.add_argument("--bits", type=int, choices=(4, 8), default=4)
        command.add_argument("--dtype", choices=DTYPES, default=None,
                             help="saved dtype (default: the model's; T4 GPUs need float16)")
        command.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
        command.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
        command.add_argument("--out", type=Path, required=True)
        command.add_argument("--force", action="store_true", help="replace an existing non-empty --out")

    evaluate = commands.add_parser("eval", help="(.venv-quantize) perplexity and KL to a reference on texts")
    evaluate.add_argument("--reference", type=Path, required=True, help="the unquantized HF folder")
    evaluate.add_argument("--model", type=Path, action="append", required=True, help="a folder to score, repeatable")
    evaluate.add_argument("--texts", type=Path, required=True)
    evaluate.add_argument("--split", default=HELD_OUT, help=f"rows scored (default {HELD_OUT}; 'all' for every row)")
    evaluate.add_argument("--max-seq-length", type=int, default=2048)
    evaluate.add_argument("--device", default=None)
    evaluate.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    return parser.parse_args(argv)


def default_device(device: str | None, threads: int | None) -> str:
    """The device to run on (cuda when present, unless told), with torch's CPU threads set when asked."""
    import torch

    if threads is not None:
        if threads < 1:
            raise QuantizeError(f"--threads {threads}: give a positive number of CPU threads")
        torch.set_num_threads(threads)
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        return interrupted(f"nothing written ({getattr(args, 'out', 'no output')} is unchanged)")


VENVS = {"gguf": ".venv (make setup)", "texts": ".venv (make setup)", "gptq": ".venv-quantize (make quantize-venv)",
         "rtn": ".venv-quantize (make quantize-venv)", "eval": ".venv-quantize (make quantize-venv)"}


def run(args: argparse.Namespace) -> int:
    try:
        if args.command == "gguf":
            out = dense_from_gguf(args.gguf, args.out, args.dtype, args.force)
            print(f"wrote {out} ({args.dtype})")
            return 0
        if args.command == "texts":
            return run_texts(args)
        if args.command in ("gptq", "rtn"):
            return run_quantize(args)
        return run_eval(args)
    except ModuleNotFoundError as err:  # run from the other venv: say which one this command needs
        raise QuantizeError(f"{args.command} runs in {VENVS[args.command]}, and {sys.executable} lacks {err.name}; "
                            f"run {VENVS[args.command].split()[0]}/bin/python tools/quantize.py {args.command} ..."
                            ) from err


def run_texts(args: argparse.Namespace) -> int:
    check_out_file(args.out)
    if args.limit is not None and args.limit < 1:
        raise QuantizeError(f"--limit {args.limit}: give a positive number of questions")
    rows = render_texts(args.data or [DEFAULT_DATA], args.model, args.config, args.held_out, args.seed, args.limit)
    write_rows(rows, args.out)
    held = sum(row["split"] == HELD_OUT for row in rows)
    print(f"wrote {args.out}: {len(rows) - held} calibration and {held} held-out texts")
    return 0


def run_quantize(args: argparse.Namespace) -> int:
    config = model_config(args.model)
    check_group_size(config, args.group_size, args.model)
    check_out(args.out, args.force)
    texts = None
    if args.command == "gptq":
        if args.max_seq_length < 16:
            raise QuantizeError(f"--max-seq-length {args.max_seq_length}: give at least 16 tokens per text")
        if not 0 <= args.dampening < 1:
            raise QuantizeError(f"--dampening {args.dampening}: give a fraction in [0, 1)")
        texts = read_texts(args.texts, CALIBRATION)
    if args.group_size not in MARLIN_GROUP_SIZES:
        print(f"note: vLLM's Marlin kernels take group sizes {MARLIN_GROUP_SIZES}; {args.group_size} may fall back "
              "to a slower kernel", file=sys.stderr)
    scheme = Scheme(args.bits, args.group_size)
    device = default_device(args.device, args.threads)
    seconds = quantize(args.model, args.out, scheme, args.command, texts, getattr(args, "max_seq_length", 0),
                       args.dtype, device, getattr(args, "dampening", 0.0), args.force)
    calibration = f" on {len(texts)} calibration texts" if texts else ""
    print(f"wrote {args.out}: {args.command} {scheme.name}{calibration} in {seconds:.1f} s on {device}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    for folder in (args.reference, *args.model):
        model_config(folder, "--reference" if folder == args.reference else "--model")
    if args.max_seq_length < 16:
        raise QuantizeError(f"--max-seq-length {args.max_seq_length}: give at least 16 tokens per text")
    texts = read_texts(args.texts, None if args.split == "all" else args.split)
    device = default_device(args.device, args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.reference)
    token_lists = [ids for ids in tokenize(tokenizer, texts, args.max_seq_length) if len(ids) > 1]
    if not token_lists:
        raise QuantizeError(f"--texts {args.texts}: no {args.split} text has two tokens to score; give longer texts")
    reference = load_for_eval(args.reference, device)
    models = {str(folder): load_for_eval(folder, device) for folder in args.model}
    result = score(reference, models, token_lists, device)
    print(f"{len(token_lists)} texts, {result['reference']['tokens']} tokens: reference {args.reference} "
          f"perplexity {result['reference']['ppl']:.3f}")
    for name in models:
        print(f"{name}: perplexity {result[name]['ppl']:.3f}, KL to reference {result[name]['kl']:.4f} nats/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
