# Two commands on a fresh clone:  `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
DEMO   ?= demo

.PHONY: demo demo-pair bench test test-fast install clean

install: $(VENV)/.installed

# torch is installed first and pinned: on these machines 2.13.0 is a CPU build on local
# disk; an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[export,serve,ray,test]'
	touch $@

PAIR   ?= examples/demo-pair
PROMPT ?= def read_config(path):

# Export the shipped code-completion pair, generate from it (target alone, then speculative).
demo: install
	$(BIN)/ssd-export --target $(PAIR)/target --draft $(PAIR)/draft --output $(DEMO)/bundle \
	    --max-context 1024 --force
	$(BIN)/ssd-run $(DEMO)/bundle --prompt "$(PROMPT)" --max-new-tokens 128 --k 0 --stats
	$(BIN)/ssd-run $(DEMO)/bundle --prompt "$(PROMPT)" --max-new-tokens 128 --stats

# Retrain the pair (36 minutes on 2 cores, measured 2026-12-01; `PRESET=quick` takes about 2).
PRESET ?= full
demo-pair: install
	$(BIN)/python tools/make_demo_pair.py --output $(PAIR) --preset $(PRESET) --threads 2 --force

# Speed of every k and mode against k=0 on the demo bundle.
bench: demo
	$(BIN)/pip install -q matplotlib
	$(BIN)/ssd-bench $(DEMO)/bundle --k 0,1,2,3,4,6,8,auto --mode sequential,split \
	    --threads 2:1,1:1 --json $(DEMO)/bench.json --plot $(DEMO)/bench.png

# Two workers (pytest-xdist), one test file each at a time: the exported bundles and tiny
# models are built once per run and shared (tests/conftest.py); traces and bundles are kept
# across runs by their inputs' hash in $SSD_TEST_CACHE (~/.cache/ssd-tests; SSD_TEST_CACHE=off
# for a cold run, tests/export_cache.py). The 40 slowest tests are printed at the end.
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=40

# The fast subset for every change: leaves out the tests marked slow (exports of every
# architecture, Hugging Face references, Ray); `make test` runs everything.
test-fast: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow" --durations=20

clean:
	rm -rf $(VENV) $(DEMO)
