# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean test-torch test-gpu

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
	$(PY) -m mypy
	$(PY) -m pytest -q

# On a machine with a GPU (CONTRIBUTING.md): the CUDA tests, then the differential
# probe of the CUDA offset model (tests/gpu/gpu_probe.py: one table and a verdict;
# the report goes to bench/results/gpu-probe.md). Without CUDA both skip cleanly.
CUDA_TESTS = tests/gpu tests/rng tests/materialize/test_errors.py \
	tests/materialize/test_order_and_devices.py tests/materialize/test_concurrent_tensors.py \
	tests/distributed/test_rows.py tests/distributed/test_api.py \
	tests/fake/test_fake_mode.py tests/checkpoint/test_writer.py
GPU_REPORT ?= bench/results/gpu-probe.md

test-gpu: $(STAMP)
	PYTHONPATH=$(CURDIR)/src $(PY) -m pytest -q -p no:cacheprovider -rs $(CUDA_TESTS)
	PYTHONPATH=$(CURDIR)/src $(PY) tests/gpu/gpu_probe.py --out $(GPU_REPORT)

lint: $(STAMP)
	$(PY) -m ruff check src tests examples
	$(PY) -m mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis

# Benchmarks (bench/README.md). matplotlib is optional for the plots only.
.PHONY: bench bench-quick
bench: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt matplotlib
	$(PY) -m bench --out bench/results

bench-quick: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt matplotlib
	$(PY) -m bench --quick --out build/bench-quick

# The suite on another PyTorch from the package index (docs/VERSIONS.md):
#   make test-torch TORCH=2.8.0 [PYTEST_ARGS=tests/distributed]
# One venv per version under TORCH_VENVS, outside the repo so that every
# checkout reuses it (PyPI's Linux wheels are CUDA builds, several GB each).
# The other test deps keep constraints.txt's pins (torch's own pin swapped
# for TORCH); this checkout's src/ goes first on the path, so one venv serves
# every branch. `make test` and CI keep the pinned local stack. Where a pip
# config caps torch, prefix PIP_CONFIG_FILE=/dev/null (PyPI alone).
TORCH ?=
TORCH_VENVS ?= $(HOME)/.cache/torchdefer/venvs
TORCH_VENV = $(TORCH_VENVS)/torch-$(TORCH)

TORCH_USAGE = { echo "usage: make $@ TORCH=2.8.0 (a torch release on the package index)"; exit 2; }

test-torch:
	@test -n "$(TORCH)" || $(TORCH_USAGE)
	@test -f $(TORCH_VENV)/.installed || $(MAKE) --no-print-directory torch-venv TORCH=$(TORCH)
	PYTHONPATH=$(CURDIR)/src $(TORCH_VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

.PHONY: torch-venv
torch-venv:
	@test -n "$(TORCH)" || $(TORCH_USAGE)
	rm -rf $(TORCH_VENV)
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	{ grep -v '^torch==' constraints.txt; echo "torch==$(TORCH)"; } > $(TORCH_VENV)/constraints.txt
	# --no-cache-dir: the wheels are large, a second copy in the cache helps nobody.
	$(TORCH_VENV)/bin/python -m pip install --quiet --no-cache-dir \
		-c $(TORCH_VENV)/constraints.txt torch
	$(TORCH_VENV)/bin/python -m pip install --quiet --no-cache-dir \
		-c $(TORCH_VENV)/constraints.txt ".[test]"
	# Only the dependencies stay: the tests import torchdefer from src/.
	$(TORCH_VENV)/bin/python -m pip uninstall --quiet --yes torchdefer
	touch $(TORCH_VENV)/.installed
