# Each target builds its virtual environment from nothing on first use.
#   make test          the suite on the newest JAX the machine's newest Python (3.12+) allows (requirements.txt)
#   make test-oldest   the whole suite on the oldest supported JAX, 0.10.2, on Python 3.11 (requirements-oldest.txt),
#                      with the clients pinned to that JAX (ejkernel), the exhaustive sweeps included
#   make test-exhaustive  the exhaustive sweeps `make test` leaves out (tests/conftest.py: EXHAUSTIVE), newest JAX
#   make test-install  `python -m build` (sdist and wheel), each installed (not editable) into a fresh environment
#                      that has the newest JAX: JAX is kept, and the installed package, shardfix-opt and the lit
#                      suite work (.ci/install-check)
# Override PYTHON, VENV or REQUIREMENTS to test another combination.

NEWEST_PYTHON := $(shell for v in 3.13 3.12; do \
    for p in python$$v $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v*/bin/python$$v 2>/dev/null); do \
      $$p -c 'import sys' >/dev/null 2>&1 && { echo $$p; exit 0; }; \
    done; done; echo python3)
OLDEST_PYTHON := $(shell for p in python3.11 $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.11*/bin/python3.11 2>/dev/null); do \
      $$p -c 'import sys' >/dev/null 2>&1 && { echo $$p; exit 0; }; done; echo python3)

PYTHON ?= $(NEWEST_PYTHON)
VENV ?= .venv
REQUIREMENTS ?= requirements.txt
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest-xdist workers (each its own process with its own 8 simulated devices; the tests share no state): two keep
# a 2-core machine busy while one test waits on XLA's compiler and another runs the passes' Python
WORKERS ?= 2
# which tests pytest runs (a -m expression; empty: all): make test leaves out the exhaustive sweeps
MARKERS ?= not exhaustive

export XLA_FLAGS := --xla_force_host_platform_device_count=8
export JAX_PLATFORMS := cpu

.PHONY: demo ring-demo _ring-demo test test-oldest test-exhaustive test-install print-python pytest lit bench bench-ring _bench-ring clean

$(STAMP): pyproject.toml $(REQUIREMENTS)
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r $(REQUIREMENTS)
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py
	$(MAKE) ring-demo

# ejkernel (the ring attention the second part balances) needs jax~=0.10: that part runs in the oldest environment.
ring-demo:
	$(MAKE) _ring-demo PYTHON=$(OLDEST_PYTHON) VENV=.venv-oldest REQUIREMENTS=requirements-oldest.txt

_ring-demo: $(STAMP)
	$(BIN)/python examples/ring_demo.py

test: pytest lit

test-oldest:
	$(MAKE) test PYTHON=$(OLDEST_PYTHON) VENV=.venv-oldest REQUIREMENTS=requirements-oldest.txt MARKERS=

test-exhaustive:
	$(MAKE) pytest MARKERS=exhaustive

test-install:
	PYTHON=$(PYTHON) .ci/install-check

print-python:
	@echo $(PYTHON)

pytest: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) -m "$(MARKERS)" tests

lit: $(STAMP)
	$(BIN)/lit -sv test/lit --param venv=$(VENV)

bench: $(STAMP)
	$(BIN)/python bench/run_all.py
	$(MAKE) bench-ring

bench-ring:
	$(MAKE) _bench-ring PYTHON=$(OLDEST_PYTHON) VENV=.venv-oldest REQUIREMENTS=requirements-oldest.txt

_bench-ring: $(STAMP)
	$(BIN)/python bench/run_all.py bench_ring

clean:
	rm -rf .venv .venv-oldest .venv-install-wheel .venv-install-sdist build dist *.egg-info python/*.egg-info
