# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export TF_CPP_MIN_LOG_LEVEL ?= 2
export PYTHONUNBUFFERED := 1

.PHONY: demo test test-quick test-oldest lint bench bench-speed install dist clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The installer is uv (fetched into the environment by pip: it downloads and unpacks in
# parallel, 2-3x faster than pip here) with the byte code compiled up front, as pip does;
# plain pip when uv cannot be had (uv reads no pip.conf: a pip-only index or an offline
# machine falls back to pip). $(call install,BIN,CONSTRAINTS) installs the package with its
# dev and experiments extras into the environment of BIN, the versions pinned by the
# constraints file. Each end of the supported range has one (setup.cfg's bounds):
# `.venv` the newest pair (`make test`), `.venv-oldest` the lowest (`make test-oldest`).
define install
	( $(1)/python -m pip install --quiet uv && \
	  $(1)/uv pip install --quiet --compile-bytecode --python $(1)/python \
	    -c $(2) -e ".[dev,experiments]" ) || \
	$(1)/python -m pip install --quiet -c $(2) -e ".[dev,experiments]"
endef

$(STAMP): $(BIN)/python setup.cfg pyproject.toml constraints/newest.txt
	$(call install,$(BIN),constraints/newest.txt)
	touch $(STAMP)

OLDEST_VENV ?= .venv-oldest
OLDEST_BIN := $(OLDEST_VENV)/bin
OLDEST_STAMP := $(OLDEST_VENV)/.installed-stamp

$(OLDEST_BIN)/python:
	$(PYTHON) -m venv $(OLDEST_VENV)

$(OLDEST_STAMP): $(OLDEST_BIN)/python setup.cfg pyproject.toml constraints/oldest.txt
	$(call install,$(OLDEST_BIN),constraints/oldest.txt)
	touch $(OLDEST_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# The whole suite (what CI runs). `make test-quick` leaves out the tests marked `slow`
# (training runs, notebooks, binaries end to end) while iterating.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow" tests

# The lowest supported TensorFlow and Keras (constraints/oldest.txt) in a second environment,
# on OLDEST_TESTS: the operators of every family (tests/ops, XLA included) and their solvers,
# every layer, loss and metric (mixed precision included), the front door, masking and the
# README, and training on two workers (`multi_worker`, which sets the Keras lower bound);
# not the other `slow` tests (training runs, notebooks, binaries), which the newest pair runs
# in `make test`, nor the two sweeps of Sinkhorn's shapes and masks (the Sinkhorn operators
# are also in tests/ops/sinkhorn's other files).
OLDEST_TESTS ?= -m "not slow or multi_worker" tests/test_versions.py tests/test_readme.py \
	tests/test_masking.py tests/ops tests/solvers tests/layers tests/losses tests/metrics \
	tests/experiments/test_training.py \
	--ignore tests/ops/sinkhorn/test_shapes.py --ignore tests/ops/sinkhorn/test_masks.py

test-oldest: $(OLDEST_STAMP)
	$(OLDEST_BIN)/python -m pytest -q -n 2 --dist loadfile $(OLDEST_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python scripts/bench_sinkhorn.py

bench-speed: $(STAMP)
	$(BIN)/python scripts/bench_speed.py --output_dir=docs/speed

# The wheel and the source distribution, into DIST_DIR (`pip install dist/softsort_tf-*.whl`,
# or upload the wheel to a Colab runtime: the notebooks' first cell installs it). `build`
# makes the sdist, then the wheel from the unpacked sdist, in an isolated environment with
# pyproject.toml's build requirements (fetched from the package index); BUILD_OPTIONS passes
# more, e.g. "--no-isolation --skip-dependency-check" to build offline with the set-up
# environment's setuptools (as tests/colabs/test_notebooks.py does).
DIST_DIR ?= dist
BUILD_OPTIONS ?=

dist: $(STAMP)
	rm -rf $(DIST_DIR)
	$(BIN)/python -m build --outdir $(DIST_DIR) $(BUILD_OPTIONS) .

clean:
	rm -rf $(VENV) $(OLDEST_VENV) build dist *.egg-info
