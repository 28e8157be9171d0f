# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1

.PHONY: demo test lint bench bench-speed install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python scripts/bench_sinkhorn.py

bench-speed: $(STAMP)
	$(BIN)/python scripts/bench_speed.py --output_dir=docs/speed

clean:
	rm -rf $(VENV) build dist *.egg-info
