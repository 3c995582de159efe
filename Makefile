# dbqueue: `make demo` and `make test` work on a fresh clone (they create .venv themselves).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# .venv is shared: the demo installs dbqueue alone (SQLite needs nothing else), the other targets
# the dev and singlestore extras too. Each stamp says its set is installed for this pyproject.toml;
# the dev set includes the demo's, so installing it stamps both.
CREATED := $(VENV)/.created
DEMO_STAMP := $(VENV)/.installed-demo
DEV_STAMP := $(VENV)/.installed-dev
PYTEST_ARGS ?=
# Tests are spread over this many pytest-xdist workers, each on tables of its own: whole files,
# longest first, the longest files one unit per database (tests/support/scheduling.py).
PYTEST_WORKERS ?= 2
DB ?= postgresql

.DEFAULT_GOAL := help
.PHONY: help venv services demo test lint format wheel bench bench-report bench-all clean distclean

help:
	@echo "make demo       run the SQLite demo (creates .venv, installs dbqueue alone, migrates)"
	@echo "make test       run the whole test suite (starts or installs PostgreSQL and MariaDB)"
	@echo "make bench DB=postgresql|mariadb|sqlite   run the benchmarks, print and save results"
	@echo "make bench-report   rebuild the README's Performance tables from benchmarks/results"
	@echo "make bench-all      make bench on the three databases, one after the other, then the report"
	@echo "make lint       ruff check + format check;  make format  fix them"
	@echo "make wheel      build dist/dbqueue_sql-*.tar.gz (sdist) and dist/dbqueue_sql-*.whl"
	@echo "make venv       just create .venv (dev set);  make services  just start the databases"
	@echo "make clean      remove build artefacts;  make distclean  also .venv"

$(CREATED):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	touch $(CREATED)

# Reinstall only when pyproject.toml changes.
$(DEMO_STAMP): pyproject.toml | $(CREATED)
	$(BIN)/pip install --quiet -e .
	touch $(DEMO_STAMP)

$(DEV_STAMP): pyproject.toml | $(CREATED)
	$(BIN)/pip install --quiet -e '.[dev,singlestore]'
	touch $(DEV_STAMP) $(DEMO_STAMP)

venv: $(DEV_STAMP)

services:
	scripts/ensure-services.sh

demo: $(DEMO_STAMP)
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

# The sdist, then the wheel built from it (so the sdist is known to hold all the wheel needs).
wheel: venv
	$(BIN)/python -m build --outdir dist

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
