# specctl: the two commands a new user needs are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0

.PHONY: setup test lint demo clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# The pinned CPU torch first: a looser requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e ".[dev,triton]"
	touch $@

setup: $(VENV)/.installed

# Two workers (pytest-xdist): most tests are single-threaded simulations, and each worker that runs a
# live test starts its own deployment. TEST_WORKERS=0 runs the suite in this process. The slowest
# tests are listed at the end, so a CI run that nears its time limit says where the time went.
TEST_WORKERS ?= 2

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=15

# The README's main command: venv + install (once), the CPU pair (quick unless a full one is built at
# engines/cpu), serve, a short live benchmark of none vs fixed:3 vs adaptive, the table, shut down.
demo: setup
	OMP_WAIT_POLICY=PASSIVE $(PY) -m control demo $(DEMO_ARGS)

lint: setup
	$(VENV)/bin/ruff check control tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
