# The few commands a contributor needs. Everything installs into .venv from scratch.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU wheel of torch 2.13.0 (a plain `torch` may pull a multi-GB CUDA build); override with TORCH=torch
TORCH  ?= torch==2.13.0

.PHONY: setup demo test lint bench mutate docs

$(BIN)/weightprep: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[train,ray,dev]"
	$(BIN)/python -m compileall -q weightprep  # as a wheel install leaves it, where PYTHONDONTWRITEBYTECODE is set
	touch $@

setup: $(BIN)/weightprep

demo: setup  ## build the bundled sample data into shards/ and show one row
	$(BIN)/weightprep build sample_data/raw.jsonl --out shards --overwrite
	$(BIN)/weightprep inspect shards --max-tokens 60

test: setup  ## the whole offline, CPU-only test suite
	$(BIN)/python -m pytest -q -n auto

docs: setup  ## serve the documentation site at http://127.0.0.1:8000 (CI builds it: tests/test_docs.py)
	$(BIN)/mkdocs serve

lint: setup
	$(BIN)/ruff check weightprep tests benchmarks sample_data

mutate: setup  ## the mutation check of the modules that place weights, lines and bytes (slow; not in CI)
	$(BIN)/python tools/mutate.py --jobs 2 --out docs/mutations.md
