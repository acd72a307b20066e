# One entry point for a fresh clone with only Python 3.11+, pip and make:
#   make demo    mutual RL of two heterogeneous policies on CPU (embedded Redis, the services, two
#                trainers), with an HTML report; no Redis or GPU to install
#   make test    the test suite against real Redis (embedded) and real gRPC sockets
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Installed first and pinned, so that no dependency can pull a newer torch with its CUDA packages.
# Here pip finds the CPU build of this version on disk; elsewhere pip takes the registry's build.
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.installed-stamp
# Real tokenizers (scripts/fetch_tokenizers.py), fetched once per machine into this cache; the tests read it too.
MRL_TOKENIZER_CACHE ?= $(HOME)/.cache/mrl/tokenizers
export MRL_TOKENIZER_CACHE
TOKENIZERS_STAMP := $(MRL_TOKENIZER_CACHE)/.fetched-stamp

.PHONY: install tokenizers test compose-test demo proto docs bench up clean

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt services/trainer/requirements.txt sdk/pyproject.toml $(wildcard services/*/pyproject.toml) launcher/pyproject.toml research/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt -r services/trainer/requirements.txt
	$(BIN)/python -m pip install --quiet -e sdk -e services/serving -e services/exchange -e services/tokenizer_align -e services/scheduler -e services/trainer -e launcher -e research
	touch $@

tokenizers: $(TOKENIZERS_STAMP)

$(TOKENIZERS_STAMP): scripts/fetch_tokenizers.py $(STAMP)
	$(BIN)/python scripts/fetch_tokenizers.py
	touch $@

test: install tokenizers
	$(BIN)/python -m pytest

# `docker compose up` for real (tests/e2e/test_compose_up.py): needs a Docker engine and Compose v2, skipped
# with the reason printed without them; not part of `make test`. A CPU host passes TORCH_INDEX_URL (the
# build argument of docs/deployment.md), e.g. make compose-test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
compose-test: install
	$(BIN)/python -m pytest -m compose -rs -p no:cacheprovider tests/e2e/test_compose_up.py

demo: install tokenizers
	$(BIN)/mrl demo examples/mutual.yaml

bench: install tokenizers
	$(BIN)/mrl bench exchange
	$(BIN)/mrl bench align
	$(BIN)/mrl bench scheduler
	$(BIN)/mrl bench trainer
	$(BIN)/mrl bench guard

up: install
	$(BIN)/mrl up examples/local.yaml

proto: install
	$(BIN)/python scripts/gen_proto.py

# docs/configuration.md from the settings models and the trainer config (a test fails when it is stale)
docs: install
	$(BIN)/python scripts/gen_config_docs.py

clean:
	rm -rf $(VENV) .mrl .pytest_cache
