"""The vLLM API our config is tested against, extracted from a vLLM wheel without importing (or installing) vllm.

Reads the wheel (a zip) and parses its source with `ast`:
  - the `EngineArgs` dataclass fields (vllm/engine/arg_utils.py): name, annotation and default as source text;
  - the parameters of `vllm.LLM.__init__` (vllm/entrypoints/llm.py); its **kwargs go to EngineArgs;
  - the `SamplingParams` fields (vllm/sampling_params.py);
  - the parameters of the `LLMEngine` methods a step-by-step driver uses (add_request, step, abort_request,
    has_unfinished_requests), from the file that defines the class (vllm/v1/engine/llm_engine.py when
    vllm/engine/llm_engine.py only re-exports it);
  - the prompt schemas add_request takes (`TokensPrompt`, `EmbedsPrompt`: TypedDict fields, vllm/inputs/data.py);
  - the parameters of the tokenizer methods the driver calls (`TokenizerLike.encode`, `.apply_chat_template`,
    vllm/tokenizers/protocol.py);
  - the command-line flags of `vllm serve` (vllm/entrypoints/openai/cli_args.py: make_arg_parser's own flags and
    one per FrontendArgs field; the "--..." literals of EngineArgs.add_cli_args and AsyncEngineArgs.add_cli_args;
    a boolean flag also has its --no- form);
  - the wheel's Requires-Python and Requires-Dist (to check requirements.txt's other pins against).
Writes them as JSON (sorted keys, source order in lists) to data/vllm/engine_api-<version>.json with the version
and the wheel's sha256, so running it again on the same wheel gives the same file.

    pip download vllm==0.14.1 --no-deps -d /tmp/vllm-wheel
    python tools/vllm_engine_args.py /tmp/vllm-wheel/vllm-0.14.1-cp38-abi3-manylinux_2_31_x86_64.whl

tests/unit/test_vllm_engine_api.py checks the keywords models/llm/vllm.py passes against the committed extract.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from utils.cli import CommandParser, command
from utils.errors import HarnessError

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "data" / "vllm"
ARG_UTILS = "vllm/engine/arg_utils.py"
LLM_FILE = "vllm/entrypoints/llm.py"
SAMPLING_FILE = "vllm/sampling_params.py"
ENGINE_FILES = ("vllm/v1/engine/llm_engine.py", "vllm/engine/llm_engine.py")
ENGINE_METHODS = ("add_request", "step", "abort_request", "has_unfinished_requests")
INPUTS_FILE = "vllm/inputs/data.py"
PROMPT_SCHEMAS = ("TokensPrompt", "EmbedsPrompt")
TOKENIZER_FILE = "vllm/tokenizers/protocol.py"
TOKENIZER_METHODS = ("encode", "apply_chat_template")
SERVE_FILE = "vllm/entrypoints/openai/cli_args.py"
FORMAT = 1  # the extract's layout: keys are only ever added under it, so a reader checks for the keys it needs


class WheelError(HarnessError):
    """A wheel that cannot be read, or lacks what is extracted (one line)."""


def _source(node: ast.AST | None) -> str | None:
    return None if node is None else ast.unparse(node)


def _class(tree: ast.Module, name: str, path: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise WheelError(f"{path}: no class {name} at module level")


def class_fields(cls: ast.ClassDef) -> list[dict]:
    """Annotated class attributes in source order (dataclass / msgspec fields); ClassVar ones left out."""
    fields = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = ast.unparse(node.annotation)
            if annotation.startswith(("ClassVar", "typing.ClassVar")):
                continue
            fields.append({"name": node.target.id, "annotation": annotation, "default": _source(node.value)})
    return fields


def signature(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict:
    """Parameters in order with kind, annotation and default as source text; `self` left out."""
    a = func.args
    params = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword"
        params.append({"name": arg.arg, "kind": kind, "annotation": _source(arg.annotation),
                       "default": _source(default)})
    if a.vararg:
        params.append({"name": a.vararg.arg, "kind": "var_positional", "annotation": _source(a.vararg.annotation),
                       "default": None})
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append({"name": arg.arg, "kind": "keyword_only", "annotation": _source(arg.annotation),
                       "default": _source(default)})
    if a.kwarg:
        params.append({"name": a.kwarg.arg, "kind": "var_keyword", "annotation": _source(a.kwarg.annotation),
                       "default": None})
    if params and params[0]["name"] in ("self", "cls"):
        params = params[1:]
    return {"async": isinstance(func, ast.AsyncFunctionDef), "parameters": params}


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    found = None
    for node in cls.body:  # the last definition wins, as in Python (overloads come first)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            found = node
    return found


class Wheel:
    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise WheelError(f"{path}: no such file; download it with "
                             "`pip download vllm==VERSION --no-deps -d DIR` and give the .whl")
        try:
            self.zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as err:
            raise WheelError(f"{path}: not a wheel (zip) file: {err}") from None
        self.path = path
        self.names = set(self.zip.namelist())

    def text(self, name: str) -> str:
        if name not in self.names:
            raise WheelError(f"{self.path}: no {name} in the wheel (not a vLLM wheel, or a layout this tool "
                             "does not know)")
        try:
            return self.zip.read(name).decode("utf-8")
        except (zipfile.BadZipFile, OSError, UnicodeDecodeError, ValueError) as err:
            raise WheelError(f"{self.path}: {name} cannot be read: {err}") from None

    def tree(self, name: str) -> ast.Module:
        try:
            return ast.parse(self.text(name), filename=name)
        except SyntaxError as err:
            raise WheelError(f"{self.path}: {name} does not parse: {err}") from None

    def metadata(self) -> dict:
        found = sorted(n for n in self.names if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        if not found:
            raise WheelError(f"{self.path}: no *.dist-info/METADATA (not a wheel)")
        message = Parser().parsestr(self.text(found[0]))
        if message.get("Name", "").lower() != "vllm" or not message.get("Version"):
            raise WheelError(f"{self.path}: a wheel of {message.get('Name')!r}, not vllm")
        return {"version": message["Version"], "requires_python": message.get("Requires-Python"),
                "requires_dist": message.get_all("Requires-Dist") or []}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def llm_engine(wheel: Wheel) -> dict:
    for path in ENGINE_FILES:
        if path not in wheel.names:
            continue
        tree = wheel.tree(path)
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LLMEngine"), None)
        if cls is None:
            continue
        methods = {}
        for name in ENGINE_METHODS:
            func = _method(cls, name)
            methods[name] = None if func is None else signature(func)
        return {"file": path, "methods": methods}
    raise WheelError(f"{wheel.path}: no class LLMEngine in {' or '.join(ENGINE_FILES)}")


def llm_members(cls: ast.ClassDef) -> dict:
    """The public methods of class LLM, and the attributes its __init__ sets on self (`llm_engine`: the engine
    a step-by-step driver uses)."""
    methods = sorted(node.name for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and not node.name.startswith("_"))
    init = _method(cls, "__init__")
    attributes = sorted({target.attr for node in ast.walk(init) if isinstance(node, (ast.Assign, ast.AnnAssign))
                         for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                         if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                         and target.value.id == "self"}) if init else []
    return {"methods": methods, "attributes": attributes}


def _flags(node: ast.AST) -> set[str]:
    """The "--..." string literals inside `node` (argparse flags written out)."""
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and n.value.startswith("--") and len(n.value) > 2}


def serve_cli(wheel: Wheel) -> dict:
    """The flags `vllm serve` accepts: make_arg_parser's own, FrontendArgs' (one per field), EngineArgs' and
    AsyncEngineArgs' (written out in their add_cli_args)."""
    tree = wheel.tree(SERVE_FILE)
    make = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_arg_parser"), None)
    if make is None:
        raise WheelError(f"{wheel.path}: {SERVE_FILE}: no function make_arg_parser")
    frontend = [f["name"] for f in class_fields(_class(tree, "FrontendArgs", SERVE_FILE))]
    engine_tree = wheel.tree(ARG_UTILS)
    engine = set()
    for name in ("EngineArgs", "AsyncEngineArgs"):
        method = _method(_class(engine_tree, name, ARG_UTILS), "add_cli_args")
        if method is None:
            raise WheelError(f"{wheel.path}: {ARG_UTILS}: {name} has no add_cli_args")
        engine |= _flags(method)
    return {"file": SERVE_FILE, "parser_flags": sorted(_flags(make)),
            "frontend_flags": ["--" + name.replace("_", "-") for name in frontend],
            "engine_flags": sorted(engine)}


def extract(path: Path) -> dict:
    wheel = Wheel(path)
    meta = wheel.metadata()
    llm_class = _class(wheel.tree(LLM_FILE), "LLM", LLM_FILE)
    llm_init = _method(llm_class, "__init__")
    inputs = wheel.tree(INPUTS_FILE)
    if llm_init is None:
        raise WheelError(f"{path}: {LLM_FILE}: class LLM has no __init__")
    return {
        "format": FORMAT,
        "version": meta["version"],
        "wheel": path.name,
        "sha256": sha256(path),
        "requires_python": meta["requires_python"],
        "requires_dist": meta["requires_dist"],
        "engine_args": {"file": ARG_UTILS,
                        "fields": class_fields(_class(wheel.tree(ARG_UTILS), "EngineArgs", ARG_UTILS))},
        "llm_init": {"file": LLM_FILE, **signature(llm_init)},
        "llm_class": {"file": LLM_FILE, **llm_members(llm_class)},
        "sampling_params": {"file": SAMPLING_FILE,
                            "fields": class_fields(_class(wheel.tree(SAMPLING_FILE), "SamplingParams",
                                                          SAMPLING_FILE))},
        "llm_engine": llm_engine(wheel),
        "prompt_schemas": {"file": INPUTS_FILE, **{name: class_fields(_class(inputs, name, INPUTS_FILE))
                                                    for name in PROMPT_SCHEMAS}},
        "tokenizer": {"file": TOKENIZER_FILE, "class": "TokenizerLike",
                      "methods": {name: signature(_required_method(wheel, TOKENIZER_FILE, "TokenizerLike", name))
                                  for name in TOKENIZER_METHODS}},
        "serve_cli": serve_cli(wheel),
    }


def _required_method(wheel: Wheel, path: str, cls: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    method = _method(_class(wheel.tree(path), cls, path), name)
    if method is None:
        raise WheelError(f"{wheel.path}: {path}: class {cls} has no method {name}")
    return method


def render(api: dict) -> str:
    return json.dumps(api, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


@command
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="vllm_engine_args.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="a vllm-*.whl (pip download vllm==X --no-deps -d DIR)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON file to write (default data/vllm/engine_api-<version>.json)")
    args = parser.parse_args(argv)
    api = extract(args.wheel)
    out = args.out or OUT_DIR / f"engine_api-{api['version']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(api), encoding="utf-8")
    print(f"wrote vllm {api['version']}: {len(api['engine_args']['fields'])} EngineArgs fields, "
          f"{len(api['sampling_params']['fields'])} SamplingParams fields to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
