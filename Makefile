# Two commands from nothing: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MB_HOME ?= $(CURDIR)/.demo-home
export MB_HOME

.PHONY: demo test lint typecheck unit integration bench clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Byte-compiling up front keeps every command's start fast (qsub: tens of ms),
# even where PYTHONDONTWRITEBYTECODE stops Python from caching on first use.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	$(BIN)/python -m compileall -q minibatch >/dev/null
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/python -m compileall -q minibatch >/dev/null
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/mb demo

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check minibatch tests daemons
	$(BIN)/ruff format --check minibatch tests daemons

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -q

bench: $(VENV)/.installed
	$(BIN)/mb bench throughput

clean:
	-$(BIN)/mb down 2>/dev/null
	rm -rf $(VENV) .demo-home .pytest_cache .mypy_cache .ruff_cache
