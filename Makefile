# Quick start: `make demo`, `make test`, `make bench`. Everything runs from .venv, built from the exact pins.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo ui test lint bench lock clean docs

install: $(STAMP)

# requirements-dev.txt is the complete lock (runtime pins included), every file hash-checked;
# the package itself goes in by a second call, as it has no hash to check (without setuptools' warning that
# ext-modules is experimental: it is what builds the compiled parts, and tests/project/test_compiled_parts.py checks them).
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml include/image_tfrecords/images/_thumbstats.c \
		include/image_tfrecords/source/_lstat.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r requirements-dev.txt
	PYTHONWARNINGS='ignore:`[tool.setuptools.ext-modules]`' $(PY) -m pip install --quiet --no-deps --no-build-isolation --editable .
	touch $@

demo: install
	$(PY) tools/demo.py

# The Airflow UI with this DAG and the datasets page, without Docker: a local S3 server and
# `airflow standalone` (it prints the URL and the admin password; Ctrl-C stops everything).
ui: install
	$(PY) tools/ui.py

# The generated parts of docs/ (the DAG's params table, from include/image_tfrecords/options.py).
docs: install
	$(PY) tools/docs.py

lint: install
	$(VENV)/bin/ruff check .

# The test modules run on TEST_WORKERS processes (pytest-xdist), each module whole on one process, so
# that a module's fixtures (a PostgreSQL, a fresh venv) are made once; the slowest modules start first
# (tests/conftest.py). TEST_WORKERS=0 runs everything in one process; TEST_ARGS adds pytest options.
TEST_WORKERS ?= 2
TEST_ARGS ?=
test: install lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(TEST_ARGS)

# Benchmark against the seed-style converters and `cp -r` (writes BENCHMARKS.md, benchmarks.png).
# Corpora come from bench/make_corpus.py (Debian's mate-backgrounds photos via `apt-get download`,
# or synthetic photos offline), cached in .bench/. BENCH_ARGS="--rounds 5 --scale 10000" etc.; see bench/run.py.
bench: install
	$(PY) bench/run.py $(BENCH_ARGS)

# Re-pin after editing requirements.in or requirements-dev.in. Pins already in the .txt files are
# kept unless the inputs force a change; LOCK_ARGS="--upgrade-package NAME" (or "--upgrade") moves
# them. The dev lock is constrained by requirements.txt, so the two never disagree. Both resolve
# for CPython 3.11.7+ on Linux (the image's python3.11 and this project's machines; some pins, e.g.
# soupsieve 4, need 3.11.5+) whatever Python or OS runs this, and hold the hashes of every file
# PyPI has for each pin (the x86-64 and arm64 wheels included).
UV_VERSION := 0.13.8
LOCK_ARGS ?=
UV_COMPILE = $(VENV)/bin/uv pip compile --quiet --generate-hashes --python-version 3.11.7 \
	--python-platform x86_64-unknown-linux-gnu --custom-compile-command "make lock" $(LOCK_ARGS)

lock:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(UV_COMPILE) --output-file requirements.txt requirements.in
	$(UV_COMPILE) --output-file requirements-dev.txt requirements-dev.in

clean:
	rm -rf .demo .ui .pytest_cache .ruff_cache
