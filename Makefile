# One entry point for a fresh clone with only Python 3.11+, pip and make:
#   make demo    the exchange end to end on an embedded Redis (no Redis or GPU to install)
#   make test    the test suite against real Redis (embedded) and real gRPC sockets
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Installed first and pinned, so that no dependency can pull a newer torch with its CUDA packages.
# Here pip finds the CPU build of this version on disk; elsewhere pip takes the registry's build.
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.installed-stamp

.PHONY: install test demo proto bench up clean

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt sdk/pyproject.toml $(wildcard services/*/pyproject.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet -e sdk -e services/exchange
	touch $@

test: install
	$(BIN)/python -m pytest

demo: install
	$(BIN)/mrl demo

bench: install
	$(BIN)/mrl bench exchange

up: install
	$(BIN)/mrl up examples/local.yaml

proto: install
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) .mrl .pytest_cache
