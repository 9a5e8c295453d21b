# Two commands on a fresh clone:  `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
DEMO   ?= demo

.PHONY: demo test install clean

install: $(VENV)/.installed

# torch is installed first and pinned: on these machines 2.13.0 is a CPU build on local
# disk; an unpinned torch would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[export,test]'
	touch $@

# Train a small code-completion pair, export it to a bundle, generate, print the stats.
demo: install
	$(BIN)/python tools/make_demo_pair.py --output $(DEMO)/pair --preset quick --force
	$(BIN)/ssd-export --target $(DEMO)/pair/target --draft $(DEMO)/pair/draft \
	    --output $(DEMO)/bundle --max-context 1024 --force
	$(BIN)/ssd-run $(DEMO)/bundle --prompt "def read_config(path):" --max-new-tokens 128 \
	    --k 0 --stats
	$(BIN)/ssd-run $(DEMO)/bundle --prompt "def read_config(path):" --max-new-tokens 128 \
	    --k 4 --stats

test: install
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO)
