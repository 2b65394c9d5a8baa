"""Fine-tune the answering model on judged runs (docs/how-to/fine-tune.md): build the data, train LoRA with TRL,
merge the adapter into a model folder, with a profile that names it (FOLDER.yaml beside it: `--set llm.profile=...`).

    # training data from run folders made with --record-prompts and judged (a person's verdicts win)
    python tools/train_llm.py data --run runs/gate/gate-dev --run runs/gate/gate-kg --out runs/ft/data --folds 2
    # SFT with LoRA on every fold but 0 (the cross-fit: fold 0 is answered by a model that never saw it)
    python tools/train_llm.py train --data runs/ft/data --exclude-fold 0 --out runs/ft/fold0
    # DPO on the preference pairs, from the merged SFT model
    python tools/train_llm.py train --method dpo --data runs/ft/data --model runs/ft/fold0/merged --out runs/ft/dpo0
    # the adapter merged into a plain folder (transformers 4.x and vLLM load it)
    python tools/train_llm.py merge --adapter runs/ft/fold0/adapter --out runs/ft/fold0/merged
    # a quick look: fold 0's rows answered by the model that never saw them, counted by target kind
    python tools/train_llm.py probe --data runs/ft/data --fold 0 --model runs/ft/fold0/merged

--model defaults to the embedded SmolLM2 (the packaged GGUF converted once). A run that stops can be continued
with the same command and --resume.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from models.config import ConfigError
from training.judged_data import FORMS_OF_TARGET, MANIFEST_FILE, PAIRS_FILE, SFT_FILE, build, read_rows, write
from training.llm_training import ADAPTER, METHODS, TrainSettings, merge, merged_profile, probe, train
from utils.cli import check_out, command


def embedded_model() -> Path:
    """The model profile's folder (configs/models/smollm2.yaml: the embedded SmolLM2, converted once)."""
    from models.llm.hf import resolve_model_folder

    return resolve_model_folder()


def model_folder(path: Path | None, flag: str = "--model") -> Path:
    folder = path or embedded_model()
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{flag} {folder}: not a model folder (no config.json); give a folder save_pretrained "
                          "wrote, or leave --model out for the embedded SmolLM2")
    return folder


def run_data(args: argparse.Namespace) -> int:
    for folder in args.run:
        if not (folder / "predictions.jsonl").is_file():
            raise ConfigError(f"--run {folder}: no predictions.jsonl; give a run folder of local_evaluation.py")
    check_out(args.out)
    built, sources = build(args.run, args.folds, raft=not args.no_raft, seed=args.seed, form=args.targets)
    if not built.sft:
        raise ConfigError(f"no training example in {', '.join(map(str, args.run))}: "
                          f"{dict(built.skipped) or 'no records'}")
    manifest = write(built, sources, args.out, args.folds, not args.no_raft, args.seed, args.targets)
    print(f"wrote {args.out}: {manifest['files'][SFT_FILE]['rows']} SFT examples of {manifest['questions']} "
          f"questions {manifest['kinds']}, {manifest['files'][PAIRS_FILE]['rows']} preference pairs; skipped "
          f"{manifest['skipped'] or 'none'}")
    return 0


def run_train(args: argparse.Namespace) -> int:
    name = SFT_FILE if args.method == "sft" else PAIRS_FILE
    data = args.data / name
    if not data.is_file():
        raise ConfigError(f"--data {args.data}: no {name}; build it with `python tools/train_llm.py data`")
    data_manifest = json.loads((args.data / MANIFEST_FILE).read_text(encoding="utf-8"))
    folds = data_manifest["folds"]
    if args.exclude_fold is not None and not 0 <= args.exclude_fold < folds:
        raise ConfigError(f"--exclude-fold {args.exclude_fold}: the data has folds 0 to {folds - 1}")
    keep = None if args.exclude_fold is None else set(range(folds)) - {args.exclude_fold}
    rows = read_rows(data, keep)
    if args.no_raft:
        rows = [row for row in rows if not row["kind"].startswith("raft")]
    model = model_folder(args.model)
    check_out(args.out)
    settings = TrainSettings(method=args.method, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha or
                             2 * args.lora_rank, learning_rate=args.learning_rate, epochs=args.epochs,
                             max_steps=args.max_steps, batch_size=args.batch_size, grad_accum=args.grad_accum,
                             max_length=args.max_length, seed=args.seed, bf16=args.bf16, save_steps=args.save_steps,
                             beta=args.beta)
    try:
        manifest = train(model, rows, args.out, settings, resume=args.resume,
                         data_manifest={"path": str(data), "manifest": data_manifest, "excluded_fold":
                                        args.exclude_fold, "no_raft": args.no_raft})
    except ValueError as err:
        raise ConfigError(str(err)) from None
    print(f"trained {manifest['steps']} steps on {manifest['rows']} rows ({manifest['rows_dropped_too_long']} too "
          f"long) in {manifest['seconds']:.0f} s, {manifest['tokens_per_second']} tokens/s; last loss "
          f"{manifest['loss'][-1]['loss']:.3f}; wrote {manifest['output']}")
    if settings.lora_rank and not args.no_merge:
        merged = merge(model, args.out / ADAPTER, args.out / "merged")
        print(f"merged into {merged}; run it with --set llm.profile={merged_profile(merged)}")
    return 0



def run_merge(args: argparse.Namespace) -> int:
    if not (args.adapter / "adapter_config.json").is_file():
        raise ConfigError(f"--adapter {args.adapter}: no adapter_config.json; give the adapter/ folder of a run")
    merged = merge(model_folder(args.model), args.adapter, args.out)
    print(f"merged into {merged}; run it with --set llm.profile={merged_profile(merged)}")
    return 0


def run_probe(args: argparse.Namespace) -> int:
    data = args.data / SFT_FILE
    if not data.is_file():
        raise ConfigError(f"--data {args.data}: no {SFT_FILE}; build it with `python tools/train_llm.py data`")
    rows = [r for r in read_rows(data, {args.fold}) if r["prompt_name"] in args.prompt]
    if args.limit:
        rows = rows[:args.limit]
    found = probe(model_folder(args.model), rows)
    for kind, counts in sorted(found.items()):
        total = sum(counts.values())
        print(f"{kind}: {total} rows: target {counts['target']}, declined {counts['idk']}, other {counts['other']}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="SFT examples and preference pairs from judged run folders")
    data.add_argument("--run", type=Path, action="append", required=True, help="a judged run folder; repeat")
    data.add_argument("--out", type=Path, required=True)
    data.add_argument("--folds", type=int, default=2, help="folds by a hash of interaction_id (default 2)")
    data.add_argument("--no-raft", action="store_true", help="leave out the RAFT variants")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--targets", choices=FORMS_OF_TARGET, default="short", help="short: the gold answer (default); "
                      "sentence: the references' sentence that holds it, and a right answer in full")
    data.set_defaults(func=run_data)
    fit = sub.add_parser("train", help="LoRA (or full) SFT or DPO with TRL")
    fit.add_argument("--data", type=Path, required=True, help="a folder `data` wrote")
    fit.add_argument("--out", type=Path, required=True)
    fit.add_argument("--model", type=Path, default=None, help="base model folder (default: the embedded SmolLM2)")
    fit.add_argument("--method", choices=METHODS, default="sft")
    fit.add_argument("--exclude-fold", type=int, default=None, help="train on every fold but this one")
    fit.add_argument("--no-raft", action="store_true", help="train without the RAFT variants")
    defaults = TrainSettings()
    fit.add_argument("--lora-rank", type=int, default=defaults.lora_rank, help="0: full fine-tuning")
    fit.add_argument("--lora-alpha", type=int, default=None, help="default: twice the rank")
    fit.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    fit.add_argument("--epochs", type=float, default=defaults.epochs)
    fit.add_argument("--max-steps", type=int, default=defaults.max_steps)
    fit.add_argument("--batch-size", type=int, default=defaults.batch_size)
    fit.add_argument("--grad-accum", type=int, default=defaults.grad_accum)
    fit.add_argument("--max-length", type=int, default=defaults.max_length)
    fit.add_argument("--save-steps", type=int, default=defaults.save_steps)
    fit.add_argument("--beta", type=float, default=defaults.beta, help="DPO's KL strength")
    fit.add_argument("--seed", type=int, default=defaults.seed)
    fit.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                     help="bfloat16 autocast (default: where the device supports it)")
    fit.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    fit.add_argument("--no-merge", action="store_true", help="write the adapter only")
    fit.set_defaults(func=run_train)
    join = sub.add_parser("merge", help="merge an adapter into its base, as a plain model folder")
    join.add_argument("--adapter", type=Path, required=True)
    join.add_argument("--out", type=Path, required=True)
    join.add_argument("--model", type=Path, default=None, help="the adapter's base (default: the embedded SmolLM2)")
    join.set_defaults(func=run_merge)
    look = sub.add_parser("probe", help="answer one fold's rows greedily and count, by kind, how many hit their target")
    look.add_argument("--data", type=Path, required=True, help="a folder `data` wrote")
    look.add_argument("--fold", type=int, required=True, help="a fold the model did not train on")
    look.add_argument("--model", type=Path, default=None, help="a model folder (default: the embedded SmolLM2)")
    look.add_argument("--prompt", action="append", default=None, help="rows of this prompt (default: reasoning)")
    look.add_argument("--limit", type=int, default=None, help="the first N rows")
    look.set_defaults(func=run_probe)
    args = parser.parse_args(argv)
    if getattr(args, "prompt", "unset") is None:
        args.prompt = ["reasoning"]
    return args


@command
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
