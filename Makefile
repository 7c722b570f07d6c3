# joulegate: `make run` starts the gateway with two local llama.cpp workers;
# `make test` runs every test. Both create the environment on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint llama-server models clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

llama-server: $(STAMP)
	bash workers/build_llama_server.sh

models: $(STAMP)
	$(BIN)/python -c "from workers.local import WORKERS, model_path; [print(model_path(w.shape)) for w in WORKERS]"

run: llama-server models
	$(BIN)/python -m workers.local

test: llama-server models
	$(BIN)/ruff check app router telemetry tests bench workers
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check app router telemetry tests bench workers
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
