# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1

.PHONY: demo test test-quick lint bench bench-speed install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The installer is uv (fetched into the environment by pip: it downloads and unpacks in
# parallel, 2-3x faster than pip here) with the byte code compiled up front, as pip does;
# plain pip when uv cannot be had (uv reads no pip.conf: a pip-only index or an offline
# machine falls back to pip).
$(STAMP): $(BIN)/python setup.cfg pyproject.toml
	( $(BIN)/python -m pip install --quiet uv && \
	  $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python \
	    -e ".[dev,experiments]" ) || \
	$(BIN)/python -m pip install --quiet -e ".[dev,experiments]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# The whole suite (what CI runs). `make test-quick` leaves out the tests marked `slow`
# (training runs, notebooks, binaries end to end) while iterating.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow" tests

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python scripts/bench_sinkhorn.py

bench-speed: $(STAMP)
	$(BIN)/python scripts/bench_speed.py --output_dir=docs/speed

clean:
	rm -rf $(VENV) build dist *.egg-info
