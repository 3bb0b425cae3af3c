# Two commands from nothing: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MB_HOME ?= $(CURDIR)/.demo-home
export MB_HOME

.PHONY: demo test lint typecheck native unit integration bench clean system-packages

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Byte-compiling up front keeps every command's start fast (qsub: tens of ms),
# even where PYTHONDONTWRITEBYTECODE stops Python from caching on first use.
# The install is editable (the tests and the daemons run the working tree) as a
# plain path in a .pth file: setuptools' default editable finder is imported by
# every Python start in the venv, ~13 ms with what it imports (the commands,
# which import most of that anyway, ~3 ms; docs/benchmarks.md, "Commands").
EDITABLE := --config-settings editable_mode=compat
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[native]' $(EDITABLE)
	$(BIN)/python -m compileall -q minibatch >/dev/null
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]' $(EDITABLE)
	$(BIN)/python -m compileall -q minibatch >/dev/null
	touch $@ $(VENV)/.installed

# The planning core compiled by mypyc (minibatch/native.py): a no-op while
# the build matches the source. The demo goes on without it (plain Python,
# the same decisions); the tests require it.
demo: $(VENV)/.installed
	@$(BIN)/python -c 'import minibatch.native as n; n.fresh() or print("compiling the planning core (about 30 s, once)")'
	@$(BIN)/python -m minibatch.native || echo "(the scheduler runs as plain Python)"
	$(BIN)/mb demo $(if $(QUICK),--quick)

native: $(VENV)/.installed
	$(BIN)/python -m minibatch.native

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check minibatch tests daemons
	$(BIN)/ruff format --check minibatch tests daemons

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

# Debian packages the tests start rather than skip: mosquitto (the MQTT tests run
# against both brokers), systemd-analyze (the units are verified), tmux (mb top
# runs in a real terminal), chromium (mb web's page, driven by playwright: no
# browser download), task-spooler (mb bench throughput --vs-task-spooler) and
# a C compiler with Python's headers (make native).
system-packages:
	@missing=""; \
	command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || missing="$$missing mosquitto"; \
	command -v tsp >/dev/null || missing="$$missing task-spooler"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	command -v tmux >/dev/null || missing="$$missing tmux"; \
	command -v cc >/dev/null || missing="$$missing gcc"; \
	$(PYTHON) -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null || missing="$$missing python3-dev"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -yq $$missing; \
	fi

# Most integration tests wait on a real cluster rather than compute, so two run
# at once (pytest-xdist, a file per worker at a time); those marked `serial`
# (timing-sensitive ones, benchmarks) then run alone. Both runs always run.
TEST_WORKERS ?= 2
test: system-packages lint typecheck native
	@status=0; \
	echo "$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m 'not serial'"; \
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m 'not serial' || status=$$?; \
	echo "$(BIN)/pytest -q -p no:xdist -m serial"; \
	$(BIN)/pytest -q -p no:xdist -m serial || status=$$?; \
	exit $$status

bench: $(VENV)/.installed
	$(BIN)/mb bench throughput

clean:
	-$(BIN)/mb down 2>/dev/null
	rm -rf $(VENV) .demo-home .pytest_cache .mypy_cache .ruff_cache minibatch/policy/_native*
