# The README's two commands: `make demo` and `make test`. Both set up a virtual environment
# first (torch pinned to the CPU build before anything that depends on it).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out/demo

.PHONY: install demo test lint

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

install: $(BIN)/.installed

demo: install
	OUT=$(OUT) PATH=$(abspath $(BIN)):$$PATH bash scripts/demo.sh

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
