"""Run UserModel over CRAG data, judge the predictions (rules, then an optional LLM judge), write the report.

Commands (`local_evaluation.py COMMAND --help` lists the flags of one): run (the default) answers the selected
questions, resuming an interrupted run; rejudge judges a run folder again; merge combines shard folders; calibrate
shows how often a judge agrees with a person; compare A B gives run B's score difference from run A with a paired
interval and the questions that flipped; ablate sets variants of the config side by side (what each module is
worth); gate fits or applies the answer gate; serve-command prints the `vllm serve`
command for a config's model profile. Each calls its module in evaluation/ (evaluation/run_command.py, ...).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from evaluation.ablation import DEFAULT_OUT as ABLATION_OUT
from evaluation.ablation import ablate, ablation_kept
from evaluation.ablation_rows import read_variants
from evaluation.calibrate_command import calibrate
from evaluation.choices import DEFAULT_DATA, Answering, ConfigChoice, Filters, JudgeChoice, RunFolder
from evaluation.compare_command import compare
from evaluation.data import parse_shard
from evaluation.gate_command import eval_command, fit_command
from evaluation.llm_server import printed_serve_command
from evaluation.merge_command import merge
from evaluation.rejudge_command import rejudge
from evaluation.run_command import answers_saved, run
from models.config import add_config_arguments
from models.loading import config_from_args
from utils.cli import CommandParser, command, interrupted

WRITE_FAILED = 1  # a run stopped by a write the system refused (ENOSPC, EACCES); its saved answers stay

COMMANDS = ("run", "rejudge", "merge", "calibrate", "compare", "ablate", "gate", "serve-command")
RUN_HELP = "answer the selected questions (resuming the run folder), judge them, write the report (the default)"


def build_parser() -> argparse.ArgumentParser:
    select, judge, folder = (CommandParser(add_help=False) for _ in range(3))
    Filters.add_arguments(select)
    JudgeChoice.add_arguments(judge)
    RunFolder.add_arguments(folder)
    parser = CommandParser(prog="local_evaluation.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", parents=[folder], help=RUN_HELP, description=RUN_HELP)
    Answering.add_arguments(run)
    sub.add_parser("rejudge", parents=[folder], help="judge a run folder's predictions again (another judge, a new "
                   "prompt); no model loads")
    sub.add_parser("merge", parents=[folder], help="combine <out>/shard-i-of-n/predictions.jsonl into <out>, judge "
                   "and report")
    calibrate = sub.add_parser("calibrate", parents=[judge], help="how often a judge agrees with a person "
                               "(data/judge/)", description="The judge's agreement with a person on each calibration "
                               "set, by kind, and its confusion matrix; then, on each set's held-back part and on "
                               "all of it, the agreement, the recall on the person's \"correct\" and on the "
                               "person's \"incorrect\", and Cohen's kappa.")
    calibrate.add_argument("--set", type=Path, action="append", default=None, dest="sets",
                           help="calibration triples (.jsonl); repeat for several (default: data/judge/calibration"
                           ".jsonl and data/judge/gate_verdicts.jsonl)")
    compare = sub.add_parser("compare", parents=[select, judge], help="run B against run A on the same questions",
                             description="Run B against run A on the questions both answered (same data file): the "
                             "score difference with a paired bootstrap interval, and the questions that flipped.")
    compare.add_argument("a", type=Path, help="run folder A (the baseline)")
    compare.add_argument("b", type=Path, help="run folder B")
    compare.add_argument("--out", type=Path, default=None, help="where compare.json goes (default: folder B)")
    compare.add_argument("--show", type=int, default=10, help="flipped questions printed per kind")
    ablate = sub.add_parser("ablate", parents=[judge], help="what each module is worth: the config and variants of "
                            "it, answered and judged alike, side by side", description="Rows: the config, then each "
                            "variant (-STAGE leaves a stage out, +STAGE switches one on, KEY=VALUE sets a key); each "
                            "against the full system (leave-one-out) or, with --incremental, on top of the row "
                            "before and against it. Every row answers with the answer gate off; the stages before "
                            "the first one a row changes come from the stage cache. docs/how-to/which-modules-pay.md")
    ablate.add_argument("--data", type=Path, default=DEFAULT_DATA, help="CRAG .jsonl or .jsonl.bz2 file")
    add_config_arguments(ablate)
    ablate.add_argument("--variant", action="append", default=[], dest="variants", metavar="'NAME: EDITS'",
                        help="a row: a name, a colon, then edits (-STAGE, +STAGE, KEY=VALUE), e.g. "
                        "'no KG: -kg' (repeatable; in order)")
    ablate.add_argument("--variants", type=Path, default=None, dest="variants_file", metavar="FILE",
                        help="rows from a YAML list of 'NAME: EDITS' lines, before any --variant")
    ablate.add_argument("--incremental", action="store_true", help="each row on top of the one before, set against "
                        "it (the seed paper's Table 2); default: each against the full system")
    ablate.add_argument("--by", default="", metavar="KEYS", help="also by question_type, domain or "
                        "static_or_dynamic (comma-separated)")
    ablate.add_argument("--limit", type=int, default=None, help="the first N questions")
    ablate.add_argument("--serve-kg", action="store_true", help="start the fixture KG server (as run does)")
    ablate.add_argument("--serve-llm", action="store_true", help="serve the profile's model with vLLM's CPU build "
                        "(as run does; with configs/overlays/vllm-cpu.yaml)")
    ablate.add_argument("--log-level", default="WARNING", help="log from this level up (DEBUG, INFO, WARNING, ...)")
    ablate.add_argument("--out", type=Path, default=ABLATION_OUT, help="where the table and the rows' run folders "
                        "go (default: runs/ablation)")
    gate = sub.add_parser("gate", help="the answer gate: fit one on judged runs, or see what one does to a run",
                          description="P(correct | the signals on each record), learnt from judged run folders; an "
                          "answer under the threshold would become \"i don't know\". gate eval shows that on a "
                          "judged run.")
    gate_sub = gate.add_subparsers(dest="gate_command", required=True)
    fit = gate_sub.add_parser("fit", help="fit a gate on judged run folders of one setup", description="Logistic "
                              "regression on the records' signals, its regularisation and threshold chosen by "
                              "cross-validation grouped by question; prints what it would save and cost.")
    fit.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="judged run folders (--out of run)")
    fit.add_argument("--out", type=Path, required=True, help="the gate file to write (JSON)")
    fit.add_argument("--rules-wrong-is-wrong", action="store_true", help="take an answer that matches no gold "
                     "answer exactly as wrong (data with short gold answers); without it such answers are left out "
                     "unless an LLM judged them")
    evaluate = gate_sub.add_parser("eval", help="apply a gate to a judged run folder (no model loads)",
                                   description="The run's score with and without the gate, paired, and the answers "
                                   "it withholds.")
    evaluate.add_argument("gate", type=Path, metavar="FILE", help="a gate file (gate fit --out)")
    evaluate.add_argument("run", type=Path, metavar="RUN", help="a judged run folder")
    serve = sub.add_parser("serve-command", help="print the `vllm serve` command for a config's model profile",
                           description="The command that serves the config's model profile (llm.profile) on a GPU "
                           "machine: the profile's folder, name, context length, dtype and overrides, on the "
                           "config's engine settings (llm.vllm), at llm.openai.base_url's host and port. Reads no "
                           "weights.")
    add_config_arguments(serve)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command and its flags; `run` where the first word names no command (`local_evaluation.py --limit 5`)."""
    for old, name in (("--rejudge", "rejudge"), ("--merge", "merge")):
        if old in argv:
            build_parser().error(f"{old} is a command now: local_evaluation.py {name} [options]")
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv = ["run", *argv]
    return build_parser().parse_args(argv)


@command
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    try:
        return dispatch(args)
    except KeyboardInterrupt:
        return interrupted(saved_after_interrupt(args, argv))
    except OSError as err:  # a full disk, a folder that stopped being writable: what was saved, how to go on
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}; {saved_after_interrupt(args, argv)}", file=sys.stderr)
        return WRITE_FAILED


def dispatch(args: argparse.Namespace) -> int:
    """The command's function in evaluation/, with the flags as typed arguments."""
    if args.command == "calibrate":
        return calibrate(JudgeChoice.from_args(args), args.sets)
    if args.command == "compare":
        return compare(args.a, args.b, Filters.from_args(args), JudgeChoice.from_args(args), args.out,
                                args.show)
    if args.command == "ablate":
        texts = (read_variants(args.variants_file) if args.variants_file else []) + args.variants
        return ablate(ConfigChoice(args.config, tuple(args.overlay), tuple(args.sets)), args.data, texts,
                      args.incremental, JudgeChoice.from_args(args), args.out, args.limit, args.serve_kg,
                      args.serve_llm, [key.strip() for key in args.by.split(",") if key.strip()], args.log_level)
    if args.command == "gate":
        if args.gate_command == "fit":
            return fit_command(args.runs, args.out, args.rules_wrong_is_wrong)
        return eval_command(args.gate, args.run)
    if args.command == "run":
        return run(RunFolder.from_args(args), Answering.from_args(args))
    if args.command == "serve-command":
        print(printed_serve_command(config_from_args(args)))
        return 0
    return (rejudge if args.command == "rejudge" else merge)(RunFolder.from_args(args))


def saved_after_interrupt(args: argparse.Namespace, argv: list[str]) -> str:
    """What Ctrl-C (or a failed write) left behind and the command that goes on from there (a run resumes:
    --restart is left out)."""
    if args.command == "ablate":
        return ablation_kept(args.out / "rows")
    if args.command not in ("run", "rejudge", "merge"):
        return "nothing was written"
    predictions = (
        RunFolder.from_args(args).folder(parse_shard(getattr(args, "shard", "1/1"))) / "predictions.jsonl"
    )
    if not predictions.exists():
        return "nothing was written"
    script = os.path.relpath(__file__)
    script = __file__ if script.startswith("..") else script
    again = shlex.join([a for a in argv if a != "--restart"])
    command_line = f"python {script}" + (f" {again}" if again else "")
    answers = answers_saved(predictions)
    if args.command == "run":
        return f"{answers} answers are saved in {predictions}; resume with: {command_line}"
    return f"{answers} answers are in {predictions}, without this pass's verdicts; run again with: {command_line}"


if __name__ == "__main__":
    sys.exit(main())
