"""Check a model folder, or make it load as the same model in transformers 5 and in the submission's transformers
4.57 (vLLM 0.14.1 pins `transformers<5`).

transformers 5 saves a model's RoPE only as `rope_parameters` in config.json; 4.57 reads `rope_theta` and
`rope_scaling` (Gemma 3's sliding layers: `rope_local_base_freq`) and takes its defaults where they are missing, so
the engine would serve the folder at another RoPE base (docs/decisions/model-folders.md). Every folder the
project's tools write is made portable already; this is for a folder you saved yourself.

    # exit 2 with the key, both values and this fix where the two stacks would read different RoPE
    python tools/model_folder.py check --model models/weights/my-llama3.1-8b-finetuned
    # write the keys 4.57 reads beside rope_parameters (and a tokenizer class it knows), in place
    python tools/model_folder.py portable --model models/weights/my-llama3.1-8b-finetuned

Standard library only: any of the project's venvs (or none) runs it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # .venv-quantize and .venv-vllm do not install the project
    sys.path.insert(0, str(REPO))

from utils.cli import CommandParser, command  # noqa: E402 - after the sys.path line
from utils.errors import ConfigError  # noqa: E402
from utils.model_folders import CONFIG, check_folder, portable_folder  # noqa: E402


@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="model_folder.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for name, what in (("check", "exit 2 where transformers 5 and 4.57 would read another RoPE"),
                       ("portable", "write the keys transformers 4.57 reads beside transformers 5's, in place")):
        commands.add_parser(name, help=what).add_argument("--model", type=Path, required=True,
                                                          help="a Hugging Face model folder")
    args = parser.parse_args(argv)
    if not (args.model / CONFIG).is_file():
        raise ConfigError(f"--model {args.model}: no {CONFIG}, so not a Hugging Face model folder; give the folder "
                          "save_pretrained wrote")
    if args.command == "portable":
        changed = portable_folder(args.model)
        print(f"{args.model}: wrote {', '.join(changed)}" if changed else f"{args.model}: already portable")
    check_folder(args.model)
    if args.command == "check":
        print(f"{args.model}: transformers 5 and 4.57 read the same RoPE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
