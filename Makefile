# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: an unpinned resolve would pull a CUDA build.
	$(PY) -m pip install --quiet -c constraints.txt torch
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/quickstart.py

test: $(STAMP)
	$(PY) -m ruff check src tests examples
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check src tests examples

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

# Benchmarks (bench/README.md). matplotlib is optional for the plots only.
.PHONY: bench bench-quick
bench: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt matplotlib
	$(PY) -m bench --out bench/results

bench-quick: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt matplotlib
	$(PY) -m bench --quick --out build/bench-quick
