# Each target builds .venv from nothing on first use (pinned jax/jaxlib 0.10.2 and the test tools).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export XLA_FLAGS := --xla_force_host_platform_device_count=8
export JAX_PLATFORMS := cpu

.PHONY: demo test pytest lit bench clean

$(STAMP): pyproject.toml requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: pytest lit

pytest: $(STAMP)
	$(BIN)/python -m pytest -q tests

lit: $(STAMP)
	$(BIN)/lit -sv test/lit

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info python/*.egg-info
