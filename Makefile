# dbqueue: `make demo` and `make test` work on a fresh clone (they create .venv themselves).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Tests are spread over this many pytest-xdist workers, each on tables of its own: whole files,
# longest first, the longest files one unit per database (tests/support/scheduling.py).
PYTEST_WORKERS ?= 2
DB ?= postgresql

.DEFAULT_GOAL := help
.PHONY: help venv services demo test lint format wheel bench bench-report bench-all clean distclean

help:
	@echo "make demo       run the SQLite demo (creates .venv, installs, migrates)"
	@echo "make test       run the whole test suite (starts or installs PostgreSQL and MariaDB)"
	@echo "make bench DB=postgresql|mariadb|sqlite   run the benchmarks, print and save results"
	@echo "make bench-report   rebuild the README's Performance tables from benchmarks/results"
	@echo "make bench-all      make bench on the three databases, one after the other, then the report"
	@echo "make lint       ruff check + format check;  make format  fix them"
	@echo "make wheel      build dist/dbqueue-*.whl"
	@echo "make venv       just create .venv;  make services  just start the databases"
	@echo "make clean      remove build artefacts;  make distclean  also .venv"

# Reinstall only when pyproject.toml changes.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,singlestore]'
	touch $(STAMP)

venv: $(STAMP)

services:
	scripts/ensure-services.sh

demo: venv
	$(BIN)/python -m dbqueue.demo

# CI is passed through from the environment: CI=true turns an unreachable database into a failure.
test: venv services
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check dbqueue tests benchmarks alembic
	$(BIN)/ruff format --check dbqueue tests benchmarks alembic

format: venv
	$(BIN)/ruff format dbqueue tests benchmarks alembic
	$(BIN)/ruff check --fix dbqueue tests benchmarks alembic

wheel: venv
	$(BIN)/python -m build --wheel --outdir dist

# The environment passes through (DBQUEUE_BENCH_POSTGRESQL_URL, DBQUEUE_BENCH_MYSQL_URL,
# DBQUEUE_BENCH_SQLITE_URL: the databases to use; DBQUEUE_BENCH_RESULTS: write elsewhere).
bench: venv services
	$(BIN)/python -m benchmarks.run $(DB)

bench-report: venv
	$(BIN)/python -m benchmarks.report

bench-all: venv services
	$(BIN)/python -m benchmarks.run postgresql
	$(BIN)/python -m benchmarks.run mariadb
	$(BIN)/python -m benchmarks.run sqlite
	$(BIN)/python -m benchmarks.report

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache dbqueue-demo.db dbqueue-demo.db-wal dbqueue-demo.db-shm
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
